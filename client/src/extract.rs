//! `tensortune extract model.onnx --batch N`: the suite of an ONNX model's workloads, in the format
//! `tune --suite` reads and `tensortune.torch.capture` writes. Shapes come from the graph's inputs
//! (a symbolic or unknown first dimension is the batch), its weights, the `value_info` that shape
//! inference leaves, and a propagation through the common operators of CNNs and transformers;
//! a node whose shapes stay unknown is skipped and named on stderr, never guessed.
//!
//! How the nodes map onto workload keys (C and D column-major, as the keys say):
//! - `Gemm` (Y = op(A) op(B) + C, row-major): M = N of Y, N = M of Y; op(A) of the key is the
//!   node's B (`t` when transB), op(B) the node's A (`t` when transA). `nn.Linear` exports as
//!   transB = 1: `tn`, as `tensortune.torch.capture` writes it.
//! - `MatMul` of A [..., M, K] and B [..., K, N]: `nn` with the key's M the N of the product; a
//!   2-D B folds A's leading dimensions into the rows, otherwise the broadcast leading dimensions
//!   are the suite entry's `batch`.
//! - `Conv` (2-D, one group, symmetric padding): NCHW in ONNX, NHWC in the key (the layout the
//!   tuned kernels read).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::{Context, bail};
use prost::Message as _;
use tensortune_kernels::Workload;

use crate::bench::{Suite, SuiteEntry};
use crate::cli::ExtractArgs;
use crate::onnx::{self, AttributeProto, GraphProto, NodeProto, elem};

/// Largest --batch: past any model's batch, short of overflowing a shape product.
const MAX_BATCH: u64 = 65536;
/// Op names kept per suite entry: enough to find the layers, short enough to read.
const MAX_OPS: usize = 6;

/// `tensortune extract`.
pub fn run(args: &ExtractArgs) -> anyhow::Result<()> {
    if !(1..=MAX_BATCH).contains(&args.batch) {
        bail!("invalid --batch {}: allowed 1 ..= {MAX_BATCH}", args.batch);
    }
    let dtype = match args.dtype.as_str() {
        "as-is" => None,
        d @ ("f16" | "bf16" | "f32") => Some(d.to_owned()),
        other => bail!("invalid --dtype {other:?}: allowed f16, bf16, f32 or as-is"),
    };
    let bytes = std::fs::read(&args.model).with_context(|| format!("cannot read {}", args.model.display()))?;
    let (suite, skipped) = extract(&bytes, &name_of(&args.model), args.batch, dtype.as_deref())?;
    for s in &skipped {
        eprintln!("skipped {s}");
    }
    let text = serde_json::to_string_pretty(&suite)? + "\n";
    match &args.output {
        Some(path) => std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?,
        None => print!("{text}"),
    }
    let count: u64 = suite.workloads.iter().map(SuiteEntry::occurrences).sum();
    eprintln!("{} distinct workloads, {count} occurrences, {} nodes skipped", suite.workloads.len(), skipped.len());
    Ok(())
}

fn name_of(path: &Path) -> String {
    path.file_stem().map_or_else(|| "model".to_owned(), |s| s.to_string_lossy().into_owned())
}

/// A tensor's shape (every dimension known) and element type.
#[derive(Clone, Debug, PartialEq)]
struct Shape {
    dims: Vec<u64>,
    elem: i32,
}

/// The suite of the model in `bytes` at batch `batch`, and a line per node skipped (why). `dtype`
/// overrides the graph's element type.
pub fn extract(bytes: &[u8], name: &str, batch: u64, dtype: Option<&str>) -> anyhow::Result<(Suite, Vec<String>)> {
    let model = onnx::ModelProto::decode(bytes).context("not an ONNX model (ModelProto did not decode)")?;
    let graph = model.graph.context("the ONNX model has no graph")?;
    let mut shapes = known_shapes(&graph, batch);
    let consumers = consumers(&graph);
    let consts = int_constants(&graph);
    let mut entries: Vec<SuiteEntry> = Vec::new();
    let mut at: HashMap<(String, Option<u64>, Option<String>), usize> = HashMap::new();
    let mut skipped = Vec::new();
    for node in &graph.node {
        let inputs: Vec<Option<&Shape>> = node.input.iter().map(|i| shapes.get(i)).collect();
        let found = match node.op_type.as_str() {
            "Gemm" | "MatMul" | "Conv" => workload_of(node, &inputs, dtype),
            _ => Ok(None),
        };
        match found {
            Ok(Some((key, mut epilogue, batch_of))) => {
                let w = Workload::from_key(&key).with_context(|| format!("node {:?} ({})", node.name, node.op_type))?;
                if let Some(after) = follower(&graph, &consumers, node) {
                    epilogue = Some(epilogue.map_or(after.clone(), |e| format!("{e}+{after}")));
                }
                let id = (w.key(), batch_of, epilogue.clone());
                let i = *at.entry(id).or_insert_with(|| {
                    entries.push(SuiteEntry {
                        workload: w.key(),
                        trials: None,
                        count: Some(0),
                        batch: batch_of,
                        epilogue,
                        ops: Vec::new(),
                    });
                    entries.len() - 1
                });
                let e = &mut entries[i];
                e.count = Some(e.count.unwrap_or(0) + 1);
                if e.ops.len() < MAX_OPS {
                    e.ops.push(node.name.clone());
                }
            }
            Ok(None) => {}
            Err(why) => skipped.push(format!("{} {:?}: {why}", node.op_type, node.name)),
        }
        if let Some(out) = infer(node, &inputs, &consts) {
            for (name, s) in node.output.iter().zip(out) {
                shapes.entry(name.clone()).or_insert(s);
            }
        }
    }
    if entries.is_empty() {
        bail!("the model has no Gemm, MatMul or Conv node with known shapes ({} skipped)", skipped.len());
    }
    let suite = Suite {
        name: name.to_owned(),
        description: format!("The matmul and conv2d workloads of {name} at batch {batch} (tensortune extract)."),
        workloads: entries,
    };
    Ok((suite, skipped))
}

/// Shapes known before propagation: graph inputs, weights, and `value_info`; a symbolic or unknown
/// first dimension of an input or value is `batch`.
fn known_shapes(graph: &GraphProto, batch: u64) -> HashMap<String, Shape> {
    let mut shapes = HashMap::new();
    for t in &graph.initializer {
        let dims = t.dims.iter().map(|d| u64::try_from(*d).unwrap_or(0)).collect();
        shapes.insert(t.name.clone(), Shape { dims, elem: t.data_type });
    }
    for v in graph.input.iter().chain(&graph.value_info).chain(&graph.output) {
        let Some(t) = v.r#type.as_ref().and_then(|t| t.tensor_type.as_ref()) else { continue };
        let Some(shape) = &t.shape else { continue };
        let dims: Option<Vec<u64>> = shape
            .dim
            .iter()
            .enumerate()
            .map(|(i, d)| match d.dim_value {
                Some(v) if v > 0 => Some(v as u64),
                _ if i == 0 => Some(batch),
                _ => None,
            })
            .collect();
        if let Some(dims) = dims {
            shapes.entry(v.name.clone()).or_insert(Shape { dims, elem: t.elem_type });
        }
    }
    shapes
}

/// Which nodes read each tensor.
fn consumers(graph: &GraphProto) -> HashMap<&str, Vec<usize>> {
    let mut out: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, n) in graph.node.iter().enumerate() {
        for input in &n.input {
            out.entry(input.as_str()).or_default().push(i);
        }
    }
    out
}

/// The epilogue a GEMM's or conv's sole reader makes of its output: `bias` (an Add of a weight),
/// `relu`, `gelu`, `bias+relu`, `bias+gelu`.
fn follower(graph: &GraphProto, consumers: &HashMap<&str, Vec<usize>>, node: &NodeProto) -> Option<String> {
    let weights: HashSet<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
    let sole = |name: &str| match consumers.get(name).map(Vec::as_slice) {
        Some([one]) => Some(&graph.node[*one]),
        _ => None,
    };
    let activation = |n: &NodeProto| match n.op_type.as_str() {
        "Relu" => Some("relu"),
        "Gelu" => Some("gelu"),
        _ => None,
    };
    let next = sole(node.output.first()?)?;
    if let Some(a) = activation(next) {
        return Some(a.to_owned());
    }
    if next.op_type == "Add" && next.input.iter().any(|i| weights.contains(i.as_str())) {
        let after = next.output.first().and_then(|o| sole(o)).and_then(activation);
        return Some(after.map_or("bias".to_owned(), |a| format!("bias+{a}")));
    }
    None
}

fn attr<'a>(node: &'a NodeProto, name: &str) -> Option<&'a AttributeProto> {
    node.attribute.iter().find(|a| a.name == name)
}

fn attr_i(node: &NodeProto, name: &str, default: i64) -> i64 {
    attr(node, name).map_or(default, |a| a.i)
}

fn attr_ints(node: &NodeProto, name: &str) -> Vec<i64> {
    attr(node, name).map(|a| a.ints.clone()).unwrap_or_default()
}

/// The workload key's types for an ONNX element type (or the --dtype override).
fn types_of(elem_type: i32, dtype: Option<&str>) -> Result<&'static str, String> {
    let name = match (dtype, elem_type) {
        (Some("f16"), _) | (None, elem::FLOAT16) => "f16",
        (Some("bf16"), _) | (None, elem::BFLOAT16) => "bf16",
        (Some("f32"), _) | (None, elem::FLOAT) => "f32",
        (_, other) => return Err(format!("element type {other} is not f16, bf16 or f32")),
    };
    Ok(match name {
        "f16" => "f16,f32,f16",
        "bf16" => "bf16,f32,bf16",
        _ => "f32,f32,f32",
    })
}

/// (key, epilogue from the node itself, batch) of a Gemm, MatMul or Conv node; `Err` says why it
/// cannot be tuned.
type Found = (String, Option<String>, Option<u64>);

fn workload_of(node: &NodeProto, inputs: &[Option<&Shape>], dtype: Option<&str>) -> Result<Option<Found>, String> {
    let shape = |i: usize| inputs.get(i).copied().flatten().ok_or_else(|| format!("the shape of input {i} is unknown"));
    let a = shape(0)?;
    let b = shape(1)?;
    let types = types_of(a.elem, dtype)?;
    let has_bias = inputs.len() > 2 && node.input.get(2).is_some_and(|n| !n.is_empty());
    let bias = has_bias.then(|| "bias".to_owned());
    match node.op_type.as_str() {
        "Gemm" => {
            let (ta, tb) = (attr_i(node, "transA", 0) != 0, attr_i(node, "transB", 0) != 0);
            let ([a0, a1], [b0, b1]) = (two(&a.dims)?, two(&b.dims)?);
            let (m, k) = if ta { (a1, a0) } else { (a0, a1) };
            let n = if tb { b0 } else { b1 };
            let alpha = attr(node, "alpha").map_or(1.0, |a| a.f);
            if alpha != 1.0 {
                return Err(format!("alpha {alpha} (only 1 is captured)"));
            }
            let layout = format!("{}{}", if tb { 't' } else { 'n' }, if ta { 't' } else { 'n' });
            Ok(Some((format!("matmul/m{n}n{m}k{k}/{layout}/{types}/alpha=1,beta=0"), bias, None)))
        }
        "MatMul" => {
            if a.dims.len() < 2 || b.dims.len() < 2 {
                return Err("a 1-D operand (a matrix-vector product)".to_owned());
            }
            let (ra, rb) = (a.dims.len(), b.dims.len());
            let (m, k, n) = (a.dims[ra - 2], a.dims[ra - 1], b.dims[rb - 1]);
            if b.dims[rb - 2] != k {
                return Err(format!("inner dimensions {k} and {} differ", b.dims[rb - 2]));
            }
            let lead = |d: &[u64]| d[..d.len() - 2].iter().product::<u64>();
            let (rows, batch) =
                if rb == 2 { (m * lead(&a.dims), None) } else { (m, Some(lead(&a.dims).max(lead(&b.dims)))) };
            let batch = batch.filter(|b| *b > 1);
            Ok(Some((format!("matmul/m{n}n{rows}k{k}/nn/{types}/alpha=1,beta=0"), None, batch)))
        }
        _ => {
            let group = attr_i(node, "group", 1);
            if group != 1 {
                return Err(format!("group {group} (grouped and depthwise convolutions are not tuned)"));
            }
            let auto_pad = attr(node, "auto_pad").map(|a| String::from_utf8_lossy(&a.s).into_owned());
            if auto_pad.as_deref().is_some_and(|p| !p.is_empty() && p != "NOTSET") {
                return Err(format!("auto_pad {auto_pad:?} (explicit pads only)"));
            }
            let ([n, c, h, w], [k, _, r, s]) = (four(&a.dims)?, four(&b.dims)?);
            let pads = or_default(attr_ints(node, "pads"), vec![0; 4]);
            if pads.len() != 4 || pads[0] != pads[2] || pads[1] != pads[3] {
                return Err(format!("pads {pads:?} (only symmetric padding is tuned)"));
            }
            let stride = or_default(attr_ints(node, "strides"), vec![1, 1]);
            let dil = or_default(attr_ints(node, "dilations"), vec![1, 1]);
            Ok(Some((
                format!(
                    "conv2d/n{n}h{h}w{w}c{c}/k{k}r{r}s{s}/pad{}x{},stride{}x{},dil{}x{}/nhwc/{types}",
                    pads[0], pads[1], stride[0], stride[1], dil[0], dil[1]
                ),
                bias,
                None,
            )))
        }
    }
}

fn or_default(v: Vec<i64>, default: Vec<i64>) -> Vec<i64> {
    if v.is_empty() { default } else { v }
}

fn two(d: &[u64]) -> Result<[u64; 2], String> {
    d.try_into().map_err(|_| format!("a {}-D operand where 2-D was expected", d.len()))
}

fn four(d: &[u64]) -> Result<[u64; 4], String> {
    d.try_into().map_err(|_| format!("a {}-D operand where 4-D (NCHW) was expected", d.len()))
}

/// The output shapes of `node` from its inputs', for the operators CNNs and transformers are
/// made of; `None` when an input shape is unknown or the operator is not one of them.
fn infer(node: &NodeProto, inputs: &[Option<&Shape>], consts: &HashMap<String, Vec<i64>>) -> Option<Vec<Shape>> {
    let first = inputs.first().copied().flatten()?;
    let with = |dims: Vec<u64>| Some(vec![Shape { dims, elem: first.elem }]);
    let spatial = |kernel: &[u64], node: &NodeProto| -> Option<Vec<u64>> {
        let [n, c, h, w] = four(&first.dims).ok()?;
        let pads = or_default(attr_ints(node, "pads"), vec![0; 4]);
        let st = or_default(attr_ints(node, "strides"), vec![1, 1]);
        let dil = or_default(attr_ints(node, "dilations"), vec![1, 1]);
        let out = |x: u64, i: usize| {
            let span = dil[i] as u64 * (kernel[i] - 1) + 1;
            (x + pads[i] as u64 + pads[i + 2] as u64).checked_sub(span).map(|v| v / st[i] as u64 + 1)
        };
        Some(vec![n, c, out(h, 0)?, out(w, 1)?])
    };
    match node.op_type.as_str() {
        "Relu" | "Gelu" | "Sigmoid" | "Tanh" | "Erf" | "Sqrt" | "Identity" | "Dropout" | "Softmax"
        | "BatchNormalization" | "LayerNormalization" | "Cast" | "Neg" | "Clip" => with(first.dims.clone()),
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Where" => {
            let mut dims = first.dims.clone();
            for other in inputs.iter().skip(1) {
                let o = &(*other)?.dims;
                if o.len() > dims.len() || (o.len() == dims.len() && o.iter().product::<u64>() > dims.iter().product())
                {
                    dims = o.clone();
                }
            }
            with(dims)
        }
        "Conv" => {
            let w = inputs.get(1).copied().flatten()?;
            let [k, _, r, s] = four(&w.dims).ok()?;
            let mut d = spatial(&[r, s], node)?;
            d[1] = k;
            with(d)
        }
        "MaxPool" | "AveragePool" => {
            let ks: Vec<u64> = attr_ints(node, "kernel_shape").iter().map(|v| *v as u64).collect();
            with(spatial(&ks, node)?)
        }
        "GlobalAveragePool" | "GlobalMaxPool" => {
            let [n, c, _, _] = four(&first.dims).ok()?;
            with(vec![n, c, 1, 1])
        }
        "Flatten" => {
            let axis = attr_i(node, "axis", 1).clamp(0, first.dims.len() as i64) as usize;
            with(vec![first.dims[..axis].iter().product(), first.dims[axis..].iter().product()])
        }
        "Gemm" => {
            let b = inputs.get(1).copied().flatten()?;
            let (ta, tb) = (attr_i(node, "transA", 0) != 0, attr_i(node, "transB", 0) != 0);
            let ([a0, a1], [b0, b1]) = (two(&first.dims).ok()?, two(&b.dims).ok()?);
            with(vec![if ta { a1 } else { a0 }, if tb { b0 } else { b1 }])
        }
        "MatMul" => {
            let b = inputs.get(1).copied().flatten()?;
            let (ra, rb) = (first.dims.len(), b.dims.len());
            if ra < 2 || rb < 2 {
                return None;
            }
            let lead = if ra >= rb { &first.dims[..ra - 2] } else { &b.dims[..rb - 2] };
            let mut d = lead.to_vec();
            d.extend([first.dims[ra - 2], b.dims[rb - 1]]);
            with(d)
        }
        "Transpose" => {
            let perm = attr_ints(node, "perm");
            let perm: Vec<usize> = if perm.is_empty() {
                (0..first.dims.len()).rev().collect()
            } else {
                perm.iter().map(|p| *p as usize).collect()
            };
            with(perm.iter().map(|p| first.dims.get(*p).copied()).collect::<Option<Vec<_>>>()?)
        }
        "Reshape" => {
            let target = consts.get(node.input.get(1)?)?;
            let total: u64 = first.dims.iter().product();
            let mut d: Vec<u64> = target
                .iter()
                .enumerate()
                .map(|(i, v)| if *v == 0 { first.dims.get(i).copied().unwrap_or(1) } else { (*v).max(1) as u64 })
                .collect();
            if let Some(i) = target.iter().position(|v| *v == -1) {
                d[i] = 1;
                d[i] = total / d.iter().product::<u64>().max(1);
            }
            with(d)
        }
        _ => None,
    }
}

/// Integer constants of the graph (INT64 weights and Constant nodes), by name: Reshape targets.
fn int_constants(graph: &GraphProto) -> HashMap<String, Vec<i64>> {
    let values = |t: &onnx::TensorProto| -> Option<Vec<i64>> {
        if t.data_type != elem::INT64 {
            return None;
        }
        if !t.int64_data.is_empty() {
            return Some(t.int64_data.clone());
        }
        Some(t.raw_data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
    };
    let mut out = HashMap::new();
    for t in &graph.initializer {
        if let Some(v) = values(t) {
            out.insert(t.name.clone(), v);
        }
    }
    for n in graph.node.iter().filter(|n| n.op_type == "Constant") {
        if let (Some(t), Some(name)) = (attr(n, "value").and_then(|a| a.t.as_ref()), n.output.first())
            && let Some(v) = values(t)
        {
            out.insert(name.clone(), v);
        }
    }
    out
}
