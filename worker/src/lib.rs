//! placeholder
pub mod nvrtc;
