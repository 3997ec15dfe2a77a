//! What a worker is told to do: which tracker, which device, how many compile threads, where the
//! cubin cache lives, and how to start its measuring child.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::sim::SimFault;
use tensortune_proto::access::Access;

/// The argument that makes a worker binary act as the measuring child (see [`crate::child_main`]).
pub const CHILD_ARG: &str = "__measure-child";

/// Tasks that may wait for the GPU (compiled, not yet measured) on top of what the compile pool
/// holds: enough that the GPU never idles while the next image is handed over, few enough that a
/// dropped job does not leave a long queue of stale work.
pub const MEASURE_QUEUE: usize = 4;

/// The device a worker drives, or the GPUs a process drives with one worker each.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DeviceSpec {
    /// GPU `n` through the CUDA driver.
    Cuda(usize),
    /// Several GPUs, one worker each (`cuda:0,1`): ascending, no repeats, at least two.
    CudaSet(Vec<usize>),
    /// Every GPU the driver sees, one worker each (`cuda:all`).
    CudaAll,
    /// The simulator: real code generation and NVRTC, analytic timings.
    Sim,
}

/// A `--device` value that is not `cuda`, `cuda:N`, `cuda:N,M,...`, `cuda:all` or `sim`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid --device {0:?}: expected cuda, cuda:N (N a GPU ordinal, e.g. cuda:0), cuda:0,1 (several GPUs), cuda:all or sim"
)]
pub struct DeviceSpecError(String);

impl DeviceSpec {
    /// Whether the spec names a single device (one worker, one measuring child).
    pub fn is_single(&self) -> bool {
        matches!(self, DeviceSpec::Cuda(_) | DeviceSpec::Sim)
    }

    /// The first device the spec names (what [`crate::probe`] describes): GPU 0 for `cuda:all`.
    pub fn first(&self) -> DeviceSpec {
        match self {
            DeviceSpec::CudaSet(ordinals) => DeviceSpec::Cuda(ordinals.first().copied().unwrap_or(0)),
            DeviceSpec::CudaAll => DeviceSpec::Cuda(0),
            single => single.clone(),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = DeviceSpecError;

    fn from_str(s: &str) -> Result<DeviceSpec, DeviceSpecError> {
        let invalid = || DeviceSpecError(s.to_owned());
        let gpus = match s.trim() {
            "sim" => return Ok(DeviceSpec::Sim),
            "cuda" => return Ok(DeviceSpec::Cuda(0)),
            "cuda:all" => return Ok(DeviceSpec::CudaAll),
            other => other.strip_prefix("cuda:").ok_or_else(invalid)?,
        };
        let mut ordinals =
            gpus.split(',').map(|n| n.trim().parse::<usize>()).collect::<Result<Vec<_>, _>>().map_err(|_| invalid())?;
        let given = ordinals.len();
        ordinals.sort_unstable();
        ordinals.dedup();
        match ordinals.as_slice() {
            _ if ordinals.len() != given => Err(invalid()),
            [one] => Ok(DeviceSpec::Cuda(*one)),
            _ => Ok(DeviceSpec::CudaSet(ordinals)),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceSpec::CudaSet(ordinals) => {
                let list: Vec<String> = ordinals.iter().map(usize::to_string).collect();
                write!(f, "cuda:{}", list.join(","))
            }
            DeviceSpec::CudaAll => f.write_str("cuda:all"),
            DeviceSpec::Sim => f.write_str("sim"),
        }
    }
}

/// Everything [`crate::run`] and [`crate::probe`] need.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The tracker's address, e.g. `http://127.0.0.1:7070`.
    pub tracker: String,
    /// The device to measure on.
    pub device: DeviceSpec,
    /// Name shown by the tracker; `None` means `<hostname>/<device>`.
    pub name: Option<String>,
    /// NVRTC threads; 0 means one per core.
    pub compile_threads: usize,
    /// On-disk cubin cache; `None` keeps compiled images in memory only.
    pub cache_dir: Option<PathBuf>,
    /// How long one measurement may take on the GPU side before its child is killed.
    pub measure_timeout: Duration,
    /// Program and arguments that start a measuring child; the device spec is appended.
    pub child_command: Vec<String>,
    /// Faults the `sim` child injects (tests of the supervision); ignored on `cuda`.
    pub sim_faults: Vec<SimFault>,
    /// The token and TLS settings of the tracker connection.
    pub access: Access,
}

impl WorkerConfig {
    /// A config with the defaults: generated name, all cores compiling, the user's cache
    /// directory, a 60 s measurement deadline and this executable as the child.
    pub fn new(tracker: impl Into<String>, device: DeviceSpec) -> WorkerConfig {
        WorkerConfig {
            tracker: tracker.into(),
            device,
            name: None,
            compile_threads: 0,
            cache_dir: default_cache_dir(),
            measure_timeout: Duration::from_secs(60),
            child_command: default_child_command(),
            sim_faults: Vec::new(),
            access: Access::default(),
        }
    }

    /// The name the worker registers with.
    pub fn worker_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| format!("{}/{}", hostname(), self.device))
    }

    /// Compile threads after resolving 0 to the number of cores.
    pub fn compile_threads(&self) -> usize {
        match self.compile_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }

    /// The config of the worker that drives GPU `ordinal` in a process driving `gpus` GPUs: it
    /// registers as `<name>/cuda:N` (`<host>/cuda:N` without a name) and gets its share of the
    /// compile threads, at least one (each worker has its own pool, so they add up to the total).
    pub fn for_gpu(&self, ordinal: usize, gpus: usize) -> WorkerConfig {
        let device = DeviceSpec::Cuda(ordinal);
        WorkerConfig {
            name: self.name.as_ref().map(|name| format!("{name}/{device}")),
            compile_threads: share(self.compile_threads(), gpus),
            device,
            ..self.clone()
        }
    }

    /// The most tasks the worker holds at once (leased and not yet reported): two per compile
    /// thread, so the pool always has its next source ready, plus [`MEASURE_QUEUE`].
    pub fn max_in_flight(&self) -> usize {
        self.compile_threads() * 2 + MEASURE_QUEUE
    }
}

/// Threads each of `gpus` workers gets out of `total`: an even share, at least one.
fn share(total: usize, gpus: usize) -> usize {
    (total / gpus.max(1)).max(1)
}

/// `$XDG_CACHE_HOME/tensortune`, else `~/.cache/tensortune`; `None` when neither is known.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("tensortune"))
}

/// This executable with [`CHILD_ARG`]; empty when the executable cannot be found (the child's
/// start then fails with a message saying to set `child_command`).
pub fn default_child_command() -> Vec<String> {
    match std::env::current_exe() {
        Ok(exe) => vec![exe.to_string_lossy().into_owned(), CHILD_ARG.to_owned()],
        Err(_) => Vec::new(),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_specs_parse_and_print() {
        assert_eq!("sim".parse::<DeviceSpec>().unwrap(), DeviceSpec::Sim);
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!("cuda:3".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(3));
        assert_eq!(DeviceSpec::Cuda(3).to_string(), "cuda:3");
        assert_eq!("cuda:all".parse::<DeviceSpec>().unwrap(), DeviceSpec::CudaAll);
        assert_eq!("cuda:2,0".parse::<DeviceSpec>().unwrap(), DeviceSpec::CudaSet(vec![0, 2]));
        assert_eq!("cuda:1, 3".parse::<DeviceSpec>().unwrap(), DeviceSpec::CudaSet(vec![1, 3]));
        assert_eq!("cuda:4,".parse::<DeviceSpec>().ok(), None);
        assert_eq!(DeviceSpec::CudaSet(vec![0, 2]).to_string(), "cuda:0,2");
        assert_eq!(DeviceSpec::CudaAll.to_string(), "cuda:all");
        for spec in ["cuda:all", "cuda:0,2", "cuda:5", "sim"] {
            assert_eq!(spec.parse::<DeviceSpec>().unwrap().to_string(), spec);
        }
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", "", "cuda:1,1", "cuda:0,,1", "cuda:0,x", "cuda:all,1"] {
            let e = bad.parse::<DeviceSpec>().unwrap_err().to_string();
            assert!(e.contains("--device") && e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn defaults_derive_from_the_config() {
        let mut c = WorkerConfig::new("http://127.0.0.1:7070", DeviceSpec::Sim);
        assert!(c.worker_name().ends_with("/sim"));
        assert_eq!(c.child_command.last().map(String::as_str), Some(CHILD_ARG));
        c.compile_threads = 3;
        assert_eq!(c.max_in_flight(), 3 * 2 + MEASURE_QUEUE);
        c.name = Some("box/gpu".into());
        assert_eq!(c.worker_name(), "box/gpu");
    }

    #[test]
    fn single_and_multi_gpu_specs() {
        assert!(DeviceSpec::Cuda(1).is_single() && DeviceSpec::Sim.is_single());
        assert!(!DeviceSpec::CudaAll.is_single() && !DeviceSpec::CudaSet(vec![0, 1]).is_single());
        assert_eq!(DeviceSpec::CudaAll.first(), DeviceSpec::Cuda(0));
        assert_eq!(DeviceSpec::CudaSet(vec![2, 3]).first(), DeviceSpec::Cuda(2));
        assert_eq!(DeviceSpec::Sim.first(), DeviceSpec::Sim);
    }

    #[test]
    fn each_gpu_gets_its_own_name_and_a_share_of_the_compile_threads() {
        let mut c = WorkerConfig::new("http://127.0.0.1:7070", DeviceSpec::CudaAll);
        c.compile_threads = 16;
        let gpu3 = c.for_gpu(3, 4);
        assert_eq!((gpu3.device.clone(), gpu3.compile_threads), (DeviceSpec::Cuda(3), 4));
        assert!(gpu3.worker_name().ends_with("/cuda:3"), "{}", gpu3.worker_name());
        assert_eq!(gpu3.tracker, c.tracker);
        c.name = Some("box".into());
        assert_eq!(c.for_gpu(1, 2).worker_name(), "box/cuda:1");
        assert_eq!((share(16, 4), share(16, 3), share(2, 8), share(0, 2), share(5, 0)), (4, 5, 1, 1, 5));
        c.compile_threads = 0;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(c.for_gpu(0, 2).compile_threads, (cores / 2).max(1));
    }
}
