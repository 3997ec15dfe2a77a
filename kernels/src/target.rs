//! The device a kernel is generated and validated for, and device-class keys.

use serde::{Deserialize, Serialize};

/// What validity rules and the analytic model need to know about a GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// Device class key (see [`class_key`]); `sim` for the simulator.
    pub class_key: String,
    /// Marketing name.
    pub name: String,
    /// Compute capability as major*10 + minor (90 for sm_90).
    pub arch: u32,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Threads one block may have.
    pub max_threads_per_block: u32,
    /// Shared memory one block may use after opting in, bytes.
    pub max_smem_per_block: u32,
    /// Shared memory per SM, bytes.
    pub smem_per_sm: u32,
    /// 32-bit registers per SM.
    pub regs_per_sm: u32,
    /// L2 cache, bytes.
    pub l2_bytes: u64,
}

/// A GPU as a worker found it: the limits validity rules use ([`Target`]) and the facts its
/// records carry for provenance. The worker's measuring child reports it, the daemon adds its
/// NVRTC version, the tracker stores it per worker (as JSON, in this shape).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// The validity limits (and class key and name).
    pub target: Target,
    /// Device memory, bytes.
    pub memory_bytes: u64,
    /// GPU UUID.
    pub uuid: String,
    /// Driver version, e.g. "580.159.04".
    pub driver_version: String,
    /// CUDA version the driver supports, e.g. "13.0".
    pub cuda_version: String,
    /// NVRTC's version where the kernels are compiled (empty from the child, which compiles
    /// nothing; the daemon fills it).
    pub nvrtc_version: String,
    /// Maximum SM clock, MHz.
    pub sm_clock_mhz: u32,
    /// Memory clock, MHz.
    pub mem_clock_mhz: u32,
}

impl Target {
    /// The simulator's device: the limits of an H100 SXM (sm_90, 132 SMs), class `sim`.
    pub fn sim() -> Target {
        Target { class_key: "sim".into(), name: "tensortune sim (H100-like)".into(), ..Target::sm90() }
    }

    /// Limits of an sm_90 part (H100/H200 SXM) for compile tests and planning.
    pub fn sm90() -> Target {
        Target {
            class_key: "generic/sm90/132sm".into(),
            name: "generic sm_90".into(),
            arch: 90,
            sm_count: 132,
            max_threads_per_block: 1024,
            max_smem_per_block: 232_448,
            smem_per_sm: 233_472,
            regs_per_sm: 65_536,
            l2_bytes: 50 << 20,
        }
    }

    /// Limits of an sm_80 part (A100) for compile tests and planning.
    pub fn sm80() -> Target {
        Target {
            class_key: "generic/sm80/108sm".into(),
            name: "generic sm_80".into(),
            arch: 80,
            sm_count: 108,
            max_threads_per_block: 1024,
            max_smem_per_block: 166_912,
            smem_per_sm: 167_936,
            regs_per_sm: 65_536,
            l2_bytes: 40 << 20,
        }
    }

    /// NVRTC's `--gpu-architecture` value for a cubin of this device. sm_90 compiles for the
    /// arch-specific `sm_90a`, whose cubins run on sm_90 parts only (as every cubin here does:
    /// images are built for the worker's exact GPU) and which alone has wgmma and setmaxnreg.
    pub fn nvrtc_arch(&self) -> String {
        if self.arch == 90 { "sm_90a".into() } else { format!("sm_{}", self.arch) }
    }

    /// Clusters of `size` blocks that run at once at `blocks_per_sm` blocks per SM. A cluster's
    /// blocks must sit in one GPC, and a part's GPCs hold different numbers of SMs, so clusters of
    /// 4 or 8 leave SMs over: an H100 SXM (132 SMs; `cuOccupancyMaxActiveClusters`, worker example
    /// `clusters`, 2026-11-27) runs 66 clusters of 2, 30 of 4 and 15 of 8 at one block per SM
    /// (120 of its SMs), and at two and three blocks per SM 62 and 92 of 4, 30 and 45 of 8. An
    /// H200 runs 15 of 8 too. Other parts are taken to lose the same share (1/11 of their block
    /// slots) to clusters of 4 or more; every measured count is at least what this gives.
    pub fn max_clusters(&self, size: u32, blocks_per_sm: u32) -> u64 {
        let slots = (self.sm_count * blocks_per_sm) as u64;
        let usable = if size <= 2 { slots } else { slots * 10 / 11 };
        usable / size.max(1) as u64
    }

    /// Whether `cp.async` (sm_80+) is available.
    pub fn has_cp_async(&self) -> bool {
        self.arch >= 80
    }
}

/// The device-class key of a GPU: what makes timings comparable (name, compute capability, SM
/// count), e.g. `nvidia-h100-80gb-hbm3/sm90/132sm`.
pub fn class_key(name: &str, arch: u32, sm_count: u32) -> String {
    let mut slug = String::with_capacity(name.len());
    for ch in name.chars() {
        if ch.is_ascii_alphanumeric() {
            slug.push(ch.to_ascii_lowercase());
        } else if !slug.ends_with('-') && !slug.is_empty() {
            slug.push('-');
        }
    }
    let slug = slug.trim_end_matches('-');
    format!("{slug}/sm{arch}/{sm_count}sm")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_keys_are_slugs() {
        assert_eq!(class_key("NVIDIA H100 80GB HBM3", 90, 132), "nvidia-h100-80gb-hbm3/sm90/132sm");
        assert_eq!(class_key("  NVIDIA  H200 ", 90, 132), "nvidia-h200/sm90/132sm");
        assert_eq!(Target::sim().class_key, "sim");
        assert_eq!(Target::sm80().nvrtc_arch(), "sm_80");
        assert_eq!(Target::sm90().nvrtc_arch(), "sm_90a");
    }

    #[test]
    fn cluster_capacity_is_at_most_what_an_h100_ran() {
        // cuOccupancyMaxActiveClusters on an H100 SXM (2026-11-27): (size, blocks per SM, clusters).
        let h100 = Target::sm90();
        for (size, per_sm, measured) in [
            (1, 1, 132),
            (2, 1, 66),
            (4, 1, 30),
            (8, 1, 15),
            (2, 2, 132),
            (4, 2, 62),
            (8, 2, 30),
            (4, 3, 92),
            (8, 3, 45),
        ] {
            let model = h100.max_clusters(size, per_sm);
            assert!(model <= measured && model + 2 >= measured, "{size} x {per_sm}: {model} against {measured}");
        }
    }
}
