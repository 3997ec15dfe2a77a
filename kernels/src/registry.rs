//! The registry: every template this build knows, by name and by operation. Templates import
//! the [`Template`] trait from [`crate::template`]; only this module names them all, so no template
//! file imports the list that imports it.

use crate::error::{Error, Result};
use crate::template::Template;
use crate::workload::Op;

/// Every template this build knows.
pub fn all() -> Vec<&'static dyn Template> {
    vec![
        &crate::gemm::WmmaGemm,
        &crate::conv::WmmaConv2d,
        &crate::wgmma::WgmmaGemm,
        &crate::wgmma::conv::WgmmaConv2d,
        &crate::simt::SimtGemm,
        &crate::ext::MmaExtGemm,
        &crate::simt_conv::SimtConv2d,
    ]
}

/// The template called `name`.
pub fn by_name(name: &str) -> Result<&'static dyn Template> {
    all().into_iter().find(|t| t.name() == name).ok_or_else(|| {
        let names: Vec<_> = all().iter().map(|t| t.name()).collect();
        Error::invalid("template", format!("unknown template {name:?}; known: {}", names.join(", ")))
    })
}

/// Every template that implements `op`, in registry order: the order (and so the slots) of the
/// templates a job that names none searches together. Empty for an op nothing implements.
pub fn templates_for(op: Op) -> Vec<&'static dyn Template> {
    all().into_iter().filter(|t| t.op() == op).collect()
}

/// The first template that implements `op` (the one a job searched before jobs searched every
/// template of their op; `wmma_gemm` for matmul).
pub fn default_for(op: Op) -> Result<&'static dyn Template> {
    all()
        .into_iter()
        .find(|t| t.op() == op)
        .ok_or_else(|| Error::invalid("template", format!("no template implements {} yet", op.name())))
}
