//! The `cuda` device backend (cudarc): loads cubins, verifies against the float64 reference, times
//! by CUDA-graph replay and times the vendor baseline the same way. Runs inside the child process.

use crate::protocol::{DeviceFacts, Executor, MeasureOutcome, MeasureRequest};

/// Drives one GPU.
pub struct CudaExecutor {
    _private: (),
}

impl CudaExecutor {
    /// Opens GPU `ordinal`. Fails with a plain message when there is no driver or no such GPU.
    pub fn new(ordinal: usize) -> anyhow::Result<CudaExecutor> {
        anyhow::bail!("cuda:{ordinal}: the cuda backend is not built yet")
    }
}

impl Executor for CudaExecutor {
    fn facts(&self) -> DeviceFacts {
        unreachable!("CudaExecutor::new never succeeds yet")
    }

    fn measure(&mut self, _request: &MeasureRequest) -> MeasureOutcome {
        unreachable!("CudaExecutor::new never succeeds yet")
    }

    fn support_loaded(&self) -> Vec<String> {
        Vec::new()
    }

    fn poisoned(&self) -> bool {
        false
    }
}
