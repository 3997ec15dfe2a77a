//! The part of ONNX's `onnx.proto` (IR version 3 onwards) that `tensortune extract` reads, declared
//! with prost's derive at the official field numbers; prost skips every other field. The workspace
//! already builds prost for the gRPC protocol, so this adds no dependency and no build step (the
//! crates that wrap ONNX bring a second protobuf runtime, or a whole inference engine).

/// `ModelProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    /// `ir_version`.
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    /// `graph`.
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
}

/// `GraphProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    /// `node`, in topological order.
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    /// `name`.
    #[prost(string, tag = "2")]
    pub name: String,
    /// `initializer`: the weights.
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    /// `input`.
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    /// `output`.
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    /// `value_info`: intermediate shapes, when shape inference ran before saving.
    #[prost(message, repeated, tag = "13")]
    pub value_info: Vec<ValueInfoProto>,
}

/// `NodeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    /// `input`.
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    /// `output`.
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    /// `name`.
    #[prost(string, tag = "3")]
    pub name: String,
    /// `op_type`.
    #[prost(string, tag = "4")]
    pub op_type: String,
    /// `attribute`.
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
}

/// `AttributeProto` (the integer and string kinds).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    /// `name`.
    #[prost(string, tag = "1")]
    pub name: String,
    /// `f`.
    #[prost(float, tag = "2")]
    pub f: f32,
    /// `i`.
    #[prost(int64, tag = "3")]
    pub i: i64,
    /// `s`.
    #[prost(bytes = "vec", tag = "4")]
    pub s: Vec<u8>,
    /// `t`: a tensor (a Constant node's value).
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    /// `ints`.
    #[prost(int64, repeated, tag = "8")]
    pub ints: Vec<i64>,
}

/// `TensorProto` (dims, type, name and the integer payloads a shape tensor uses).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// `dims`.
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    /// `data_type` (`TensorProto.DataType`).
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    /// `int64_data`.
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    /// `name`.
    #[prost(string, tag = "8")]
    pub name: String,
    /// `raw_data`: little-endian values.
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
}

/// `ValueInfoProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    /// `name`.
    #[prost(string, tag = "1")]
    pub name: String,
    /// `type`.
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

/// `TypeProto` (tensors only).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    /// `tensor_type`.
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TensorTypeProto>,
}

/// `TypeProto.Tensor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorTypeProto {
    /// `elem_type` (`TensorProto.DataType`).
    #[prost(int32, tag = "1")]
    pub elem_type: i32,
    /// `shape`.
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

/// `TensorShapeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    /// `dim`.
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// `TensorShapeProto.Dimension`: a value or a symbol.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Dimension {
    /// `dim_value`.
    #[prost(int64, optional, tag = "1")]
    pub dim_value: Option<i64>,
    /// `dim_param`.
    #[prost(string, optional, tag = "2")]
    pub dim_param: Option<String>,
}

/// `TensorProto.DataType` values the extractor maps to workload types.
pub mod elem {
    /// FLOAT.
    pub const FLOAT: i32 = 1;
    /// INT64 (shape tensors).
    pub const INT64: i32 = 7;
    /// FLOAT16.
    pub const FLOAT16: i32 = 10;
    /// BFLOAT16.
    pub const BFLOAT16: i32 = 16;
}
