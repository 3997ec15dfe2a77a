//! The `cuda` device backend (cudarc): loads cubins, verifies every output element against the
//! float64 reference, times by CUDA-graph replay (warm, or one launch per sample from a cold L2
//! when the request flushes; see `timing`), and times the vendor baseline the same way, on the
//! same buffers: cuBLAS for matmul (the fastest of `cublasGemmEx`, in `blas`, and cuBLASLt's
//! heuristic candidates, in `blaslt`), cuDNN for conv2d (`dnn`). Runs inside the measuring
//! child process, one request at a time.

mod blas;
mod blaslt;
mod device;
mod dnn;
mod grouped;
mod nvml;
mod timing;
mod workload;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::CUfunction_attribute_enum as FnAttr;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig};
use cudarc::nvrtc::Ptx;
use tensortune_kernels::energy::Regime;
use tensortune_kernels::{Activation, DType, Epilogue, InputScale, Matmul, Workload};

use crate::protocol::{Device, Executor, MeasureOutcome, MeasureRequest, Status};
use device::{Context, CudaFailure, DevBuf, launch};
use workload::{InputSet, WorkloadState};

/// Workloads whose buffers stay resident; older ones are freed (a 4096^3 f16 workload holds
/// about 0.6 GB: inputs twice, output, and three float64 reference arrays).
const RESIDENT_WORKLOADS: usize = 2;
/// A finalist's re-pick of the vendor (`MeasureRequest::repick_baseline`) times again the
/// cuBLASLt candidates whose first timing came within this factor of the fastest's: the re-pick is
/// there because the order of close candidates can change under the rounds' load (an H100 at its
/// power cap, 2026-11-26: 3% apart in a burst, the other way round held for seconds), not to time
/// candidates 16-75% slower again (f16 512x64x512 on an H200, 2026-11-28: 3 of 7 within 10%). Up
/// to nine 50 ms timings were a quarter of the finalists of a 4096^3 job.
const REPICK_MARGIN: f64 = 1.10;
/// Shared memory a block may use without opting in.
const DEFAULT_SMEM_LIMIT: u32 = 48 * 1024;

/// Drives one GPU.
pub struct CudaExecutor {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    facts: Device,
    blas: Option<Result<blas::Blas, String>>,
    /// cuBLASLt, created by the first matmul baseline of this child (or why it could not be).
    lt: Option<Result<blaslt::Lt, String>>,
    /// cuDNN, loaded by the first conv baseline of this child (or why it could not be).
    dnn: Option<Result<dnn::Dnn, String>>,
    workloads: VecDeque<WorkloadState>,
    /// Vendor time (or why there is none) per workload key and L2 flush, for this session.
    baselines: HashMap<(String, bool), (Option<f64>, String)>,
    /// The vendor algorithm the last full timing of every candidate picked, per workload key and
    /// L2 flush, with its kind: what a `fresh_baseline` request times again.
    picks: HashMap<(String, bool), (VendorPick, String)>,
    /// The time of each cuBLASLt candidate (by position, `None`: skipped) at the first timing of
    /// every candidate, per baseline key (workload, regime, L2 flush) and plan (fused or not): a
    /// finalist's re-pick times again only those within [`REPICK_MARGIN`] of the fastest of them.
    lt_times: HashMap<(BaselineKey, bool), Vec<Option<f64>>>,
    /// What every timing needs: stream, L2 flush scratch and NVML.
    timer: Timer,
    poisoned: bool,
    /// The energy per launch of the latest baseline, when it was timed as the pick alone (the
    /// energy of a timing of every candidate belongs to the last candidate, not the pick).
    vendor_energy_mj: Option<f64>,
    /// The energy per launch of each baseline in `baselines`, when read.
    baseline_energy: HashMap<(String, bool), Option<f64>>,
}

/// A failed measurement: the status to report and the text.
struct Fail(Status, String);

/// What a vendor kind says when the vendor's output disagreed with our reference.
pub(super) const CHECK_FAILED: &str = "its output failed our check";

/// The elementwise kernel that follows each run of a cuBLASLt baseline, for the part of the
/// epilogue cuBLASLt did not fuse.
#[derive(Clone, Copy, Debug)]
enum After {
    /// None: cuBLASLt computed the whole epilogue.
    Nothing,
    /// The whole epilogue (`tt_epilogue`) on cuBLASLt's plain product.
    Epilogue,
    /// The activation alone (`tt_activate`) after cuBLASLt's fused bias and residual.
    Activation,
}

impl After {
    fn run(self, w: &WorkloadState, stream: &CudaStream) -> Result<(), CudaFailure> {
        match self {
            After::Nothing => Ok(()),
            After::Epilogue => w.apply_epilogue(stream),
            After::Activation => w.apply_activation(stream),
        }
    }
}

/// The vendor algorithm a baseline picked, so that it can be timed again alone.
#[derive(Clone, Copy, Debug)]
enum VendorPick {
    /// `cublasGemmEx`.
    GemmEx,
    /// cuBLASLt's heuristic candidate of this number (from 1), in the heuristic's order.
    Lt(usize),
    /// cuDNN's forward algorithm and math type.
    Conv(dnn::ConvPick),
}

/// A vendor algorithm to time alone ([`CudaExecutor::vendor_alone`]): `fastest` (every candidate
/// of the workload's library, cuBLAS or cuDNN, the fastest reported, as a trial's baseline is;
/// then, on a request with `fresh_baseline`, that pick alone), or for a matmul `gemmex`
/// (`cublasGemmEx`) or `lt:N` (cuBLASLt's heuristic candidate N, from 1).
#[derive(Clone, Copy, Debug)]
pub struct VendorAlgorithm(Option<VendorPick>);

impl std::str::FromStr for VendorAlgorithm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let max = blaslt::MAX_CANDIDATES;
        match s.split_once(':') {
            None if s == "fastest" => Ok(VendorAlgorithm(None)),
            None if s == "gemmex" => Ok(VendorAlgorithm(Some(VendorPick::GemmEx))),
            Some(("lt", n)) => match n.parse::<usize>() {
                Ok(n) if (1..=max).contains(&n) => Ok(VendorAlgorithm(Some(VendorPick::Lt(n)))),
                _ => Err(format!("{s:?}: the cuBLASLt candidate number must be 1 to {max}")),
            },
            _ => Err(format!("{s:?}: expected fastest, gemmex or lt:N (N from 1 to {max})")),
        }
    }
}

impl VendorAlgorithm {
    /// Whether `workload` can be timed with this algorithm: `gemmex` and `lt:N` are cuBLAS's, for
    /// a matmul only.
    pub fn check(&self, workload: &Workload) -> Result<(), String> {
        let cublas = match self.0 {
            Some(VendorPick::GemmEx) => "gemmex".to_string(),
            Some(VendorPick::Lt(n)) => format!("lt:{n}"),
            Some(VendorPick::Conv(_)) | None => return Ok(()),
        };
        match workload {
            Workload::Conv2d(_) => {
                Err(format!("{cublas:?}: a cuBLAS algorithm; a conv2d workload takes fastest (cuDNN's candidates)"))
            }
            _ => Ok(()),
        }
    }
}

/// GPUs the CUDA driver sees (after `CUDA_VISIBLE_DEVICES`), for `cuda:all`. Blocking: call it
/// on a blocking thread. It initialises the driver in the calling process (children started later
/// are new programs, so this does not leak into them).
pub(crate) fn device_count() -> anyhow::Result<usize> {
    // SAFETY: only tries to dlopen libcuda by its candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        anyhow::bail!("the CUDA driver (libcuda.so) was not found; is this a GPU machine?");
    }
    let count = CudaContext::device_count().map_err(|e| anyhow::anyhow!("cannot count the GPUs: {e:?}"))?;
    Ok(count.max(0) as usize)
}

impl CudaExecutor {
    /// Opens GPU `ordinal`. Fails with a plain message when there is no driver or no such GPU; the
    /// caller names the device (the worker daemon's error says `opening cuda:N`).
    pub fn new(ordinal: usize) -> anyhow::Result<CudaExecutor> {
        // SAFETY: only tries to dlopen libcuda by its candidate names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            anyhow::bail!("the CUDA driver (libcuda.so) was not found; is this a GPU machine?");
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| anyhow::anyhow!("cannot open GPU {ordinal}: {e:?}"))?;
        // SAFETY: this backend never hands cudarc-tracked slices to more than one stream: every
        // kernel argument is a raw pointer and all work goes to the one stream below.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| anyhow::anyhow!("cannot create a stream: {e:?}"))?;
        let facts = device::facts(&ctx).map_err(|e| anyhow::anyhow!("{e}"))?;
        let timer = Timer {
            ctx: ctx.clone(),
            stream: stream.clone(),
            l2_bytes: facts.target.l2_bytes,
            flush_scratch: None,
            nvml: nvml::Nvml::open(&facts.uuid),
            hot: false,
        };
        Ok(CudaExecutor {
            ctx,
            stream,
            facts,
            blas: None,
            lt: None,
            dnn: None,
            workloads: VecDeque::new(),
            baselines: HashMap::new(),
            picks: HashMap::new(),
            lt_times: HashMap::new(),
            timer,
            poisoned: false,
            vendor_energy_mj: None,
            baseline_energy: HashMap::new(),
        })
    }

    /// Classifies a driver failure, marking the context poisoned when the error is sticky.
    fn fail(&mut self, f: CudaFailure) -> Fail {
        if f.is_sticky() || self.ctx.synchronize().is_err() {
            self.poisoned = true;
        }
        if f.is_resource_limit() && !self.poisoned {
            Fail(Status::InvalidConfig, format!("the GPU refused the launch: {f}"))
        } else {
            Fail(Status::LaunchError, f.to_string())
        }
    }

    /// The state of `req.workload`, created from the support module when not resident.
    fn workload_index(&mut self, req: &MeasureRequest) -> Result<usize, Fail> {
        if let Some(i) = self.workloads.iter().position(|w| w.workload.key() == req.workload_key) {
            return Ok(i);
        }
        if req.support_cubin.is_empty() {
            return Err(Fail(
                Status::LaunchError,
                format!("the support module of {} was not sent to this child (daemon bug)", req.workload_key),
            ));
        }
        while self.workloads.len() >= RESIDENT_WORKLOADS {
            self.workloads.pop_front();
        }
        let state =
            WorkloadState::new(&self.ctx, &self.stream, &req.workload, &req.support_cubin).map_err(|f| self.fail(f))?;
        tracing::debug!(workload = %req.workload_key, mib = state.bytes() >> 20, "workload resident");
        // Its float64 reference just ran, a naive GEMM over the whole problem: see `timing::Extra`.
        self.timer.hot = true;
        self.workloads.push_back(state);
        Ok(self.workloads.len() - 1)
    }

    /// Loads the kernel and checks it can launch with the requested shape.
    fn load(&mut self, req: &MeasureRequest) -> Result<(CudaFunction, u32, u32), Fail> {
        let l = &req.launch;
        let module = self
            .ctx
            .load_module(Ptx::from_binary(req.cubin.clone()))
            .when(|| format!("when loading {}", l.name))
            .map_err(|f| self.fail(f))?;
        let func =
            module.load_function(&l.entry).when(|| format!("when looking up {}", l.entry)).map_err(|f| self.fail(f))?;
        let attr = |a: FnAttr| func.get_attribute(a).map(|v| v.max(0) as u32);
        let regs = attr(FnAttr::CU_FUNC_ATTRIBUTE_NUM_REGS).unwrap_or(0);
        let static_smem = attr(FnAttr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES).unwrap_or(0);
        let max_threads = attr(FnAttr::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK).unwrap_or(0);
        let threads: u32 = l.block.iter().product();
        if threads > max_threads {
            return Err(Fail(
                Status::InvalidConfig,
                format!(
                    "{} uses {regs} registers per thread, so a block may have at most {max_threads} threads; the config launches {threads}",
                    l.name
                ),
            ));
        }
        let smem = static_smem + l.smem_bytes;
        if smem > self.facts.target.max_smem_per_block {
            return Err(Fail(
                Status::InvalidConfig,
                format!(
                    "{} needs {smem} bytes of shared memory; this GPU allows {} per block",
                    l.name, self.facts.target.max_smem_per_block
                ),
            ));
        }
        // Static shared memory (the split-K flag) counts against the same 48 KiB default.
        if smem > DEFAULT_SMEM_LIMIT {
            func.set_attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, l.smem_bytes as i32)
                .when(|| format!("when opting {} into {} bytes of shared memory", l.name, l.smem_bytes))
                .map_err(|f| self.fail(f))?;
        }
        Ok((func, regs, smem))
    }

    /// After launches of `req`'s kernel (`what`): a `wrong_result` when it wrote past the end of
    /// the output or of its workspace (`ws`), and then the workload's inputs and reference are
    /// generated again, so that whatever it overwrote beyond cannot fail the configs after it.
    fn guard(&mut self, wi: usize, req: &MeasureRequest, ws: Option<&DevBuf>, what: &str) -> Result<(), Fail> {
        let w = &self.workloads[wi];
        let mut overruns = Vec::new();
        if let Some(d) = w.output_overrun(&self.stream).map_err(|f| self.fail(f))? {
            overruns.push(("the output", d));
        }
        if let Some(ws) = ws
            && let Some(d) = workload::workspace_overrun(&self.stream, ws, req.launch.workspace_bytes as usize)
                .map_err(|f| self.fail(f))?
        {
            overruns.push(("its workspace", d));
        }
        if overruns.is_empty() {
            return Ok(());
        }
        let w = &self.workloads[wi];
        w.restore(&self.stream).map_err(|f| self.fail(f))?;
        let said: Vec<String> = overruns
            .iter()
            .map(|(buf, d)| format!("{} bytes past the end of {buf} (the first {} bytes after it)", d.changed, d.first))
            .collect();
        tracing::warn!(workload = %req.workload_key, kernel = %req.launch.name, "a kernel wrote out of bounds: {}", said.join("; "));
        Err(Fail(
            Status::WrongResult,
            format!(
                "{} wrote out of bounds in {what}: {}; the inputs and reference were generated again",
                req.launch.name,
                said.join("; ")
            ),
        ))
    }

    /// One launch of the kernel under test on `set`, then a full check against the reference.
    /// A check that fails is repeated once on inputs and a reference generated again, so that a
    /// reference some earlier kernel overwrote (beyond the canaries) fails no config but that one.
    fn run_and_check(
        &mut self,
        wi: usize,
        func: &CudaFunction,
        req: &MeasureRequest,
        ws: Option<&DevBuf>,
    ) -> Result<(f64, f64), Fail> {
        match self.run_and_check_once(wi, func, req, ws) {
            Err(Fail(Status::WrongResult, first)) => {
                self.workloads[wi].restore(&self.stream).map_err(|f| self.fail(f))?;
                let again = self.run_and_check_once(wi, func, req, ws);
                if again.is_ok() {
                    tracing::warn!(workload = %req.workload_key, kernel = %req.launch.name, "the check failed, then passed on inputs and a reference generated again: something had overwritten them ({first})");
                } else {
                    // Whatever this kernel wrote must not fail the next config.
                    self.workloads[wi].restore(&self.stream).map_err(|f| self.fail(f))?;
                }
                again
            }
            other => other,
        }
    }

    fn run_and_check_once(
        &mut self,
        wi: usize,
        func: &CudaFunction,
        req: &MeasureRequest,
        ws: Option<&DevBuf>,
    ) -> Result<(f64, f64), Fail> {
        let l = &req.launch;
        let cfg = launch_config(l);
        let w = &self.workloads[wi];
        let args = w.args(&l.args, InputSet::Check, ws).map_err(|f| self.fail(f))?;
        let w = &self.workloads[wi];
        let r = w
            .poison(&self.stream)
            .and_then(|_| launch(&self.stream, func, cfg, &args).when(|| format!("when launching {}", l.name)))
            .and_then(|_| self.stream.synchronize().when(|| format!("when running {}", l.name)));
        r.map_err(|f| self.fail(f))?;
        let w = &self.workloads[wi];
        let cmp = w.compare(&self.stream, &req.tolerance).map_err(|f| self.fail(f))?;
        if cmp.failures > 0 {
            let w = &self.workloads[wi];
            let detail = match cmp.first_bad {
                Some(i) => match w.value_at(&self.stream, i) {
                    Ok((got, want)) => format!("first at {}: got {got}, expected {want}", w.describe(i)),
                    Err(e) => format!("first at {} ({e})", w.describe(i)),
                },
                None => String::new(),
            };
            return Err(Fail(
                Status::WrongResult,
                format!(
                    "{} of {} outputs differ from the reference ({} never written); max abs error {:.3e}, max rel error {:.3e}; {detail}",
                    cmp.failures,
                    tensortune_kernels::support::operand_elements(&w.workload).2,
                    cmp.unwritten,
                    cmp.max_abs,
                    cmp.max_rel
                ),
            ));
        }
        Ok((cmp.max_abs, cmp.max_rel))
    }

    fn measure_inner(&mut self, req: &MeasureRequest) -> Result<MeasureOutcome, Fail> {
        let wi = self.workload_index(req)?;
        let (func, registers, smem_bytes) = self.load(req)?;
        let ws = match req.launch.workspace_bytes {
            0 => None,
            n => Some(workload::workspace(&self.ctx, &self.stream, n as usize).map_err(|f| self.fail(f))?),
        };
        let (max_abs, max_rel) = self.run_and_check(wi, &func, req, ws.as_ref())?;
        self.guard(wi, req, ws.as_ref(), "its checked launch")?;

        let cfg = launch_config(&req.launch);
        let args =
            self.workloads[wi].args(&req.launch.args, InputSet::Timing, ws.as_ref()).map_err(|f| self.fail(f))?;
        let name = req.launch.name.clone();
        let key = baseline_key(req);
        let wants_baseline = req.baseline && (req.fresh_baseline || !self.baselines.contains_key(&key));
        // The vendor before this kernel when asked (a burst finalist's alternate rounds).
        if wants_baseline && req.baseline_first {
            self.time_baseline(wi, req, &key);
        }
        // The clock while the GPU is busy with this kernel, read just before its timed replays.
        let sm_clock_mhz = self.sm_clock_mhz();
        let timed = self.timer.time(req, |s| launch(s, &func, cfg, &args).when(|| format!("when launching {name}")));
        let timing = timed.map_err(|f| self.fail(f))?;
        self.guard(wi, req, ws.as_ref(), "its timed launches")?;

        // The same check after hundreds of launches: catches state a kernel leaves behind (split-K
        // counters) and races that only show on later runs.
        self.run_and_check(wi, &func, req, ws.as_ref()).map_err(|Fail(status, text)| {
            Fail(
                status,
                format!(
                    "passed the first check, then failed after {} timed launches: {text}",
                    timing.batch * (req.samples + 1)
                ),
            )
        })?;

        if wants_baseline && !req.baseline_first {
            self.time_baseline(wi, req, &key);
        }
        let baseline_energy_mj = self.baseline_energy.get(&key).copied().flatten();
        let (baseline_us, baseline_kind) = self.baselines.get(&key).cloned().unwrap_or((None, String::new()));
        Ok(MeasureOutcome {
            status: Status::Ok,
            error: String::new(),
            samples_us: timing.samples_us,
            median_us: timing.time_us,
            spread: timing.spread,
            batch: timing.batch,
            baseline_us,
            baseline_kind,
            max_abs_err: Some(max_abs),
            max_rel_err: Some(max_rel),
            registers,
            smem_bytes,
            measure_ms: 0.0,
            sm_clock_mhz,
            power: timing.power,
            regime: req.regime,
            settle_ms: timing.settle_ms,
            steady: timing.steady,
            baseline_energy_mj,
            trace: timing.trace,
        })
    }

    /// Loads cuBLAS and cuBLASLt if this child has not yet (about 0.2 s on an H200): done after
    /// a matmul measurement without a baseline (the drift reference the worker times when it
    /// starts, while it waits for its first tasks), so that the first task of a job does not wait
    /// for them. A library that does not load is remembered as such, as on first use.
    fn load_matmul_vendor(&mut self) {
        if self.blas.is_none() {
            self.blas = Some(blas::Blas::new(&self.stream));
        }
        if self.lt.is_none() {
            let loaded = blaslt::Lt::new(&self.stream);
            if let Err(e) = &loaded {
                tracing::debug!("matmul baselines are cublasGemmEx alone: {e}");
            }
            self.lt = Some(loaded);
        }
    }

    /// Times the vendor baseline as `req` asks ([`CudaExecutor::timed_baseline`]) and keeps it, with
    /// its energy, under `key`.
    fn time_baseline(&mut self, wi: usize, req: &MeasureRequest, key: &BaselineKey) {
        let b = self.timed_baseline(wi, req);
        self.baseline_energy.insert(key.clone(), self.vendor_energy_mj);
        self.baselines.insert(key.clone(), b);
    }

    /// The vendor baseline as `req` asks: with `fresh_baseline`, the algorithm picked earlier for
    /// this workload timed again alone (under the kind it was picked as); otherwise, with
    /// `repick_baseline`, or when there is no pick or it no longer runs, every candidate, keeping
    /// the fastest as the pick.
    fn timed_baseline(&mut self, wi: usize, req: &MeasureRequest) -> (Option<f64>, String) {
        self.vendor_energy_mj = None;
        let key = baseline_key(req);
        if req.fresh_baseline
            && !req.repick_baseline
            && let Some((pick, kind)) = self.picks.get(&key).cloned()
        {
            match self.baseline(wi, req, Some(pick)) {
                // The kind it was picked as, unless this time its output failed our check.
                (Some(us), now, _) if now.contains(CHECK_FAILED) => return (Some(us), now),
                (Some(us), _, _) => {
                    self.vendor_energy_mj = timing::last_power().energy_mj;
                    return (Some(us), kind);
                }
                (None, why, _) => {
                    tracing::warn!(workload = %req.workload_key, "the vendor's pick could not be timed again ({why}); timing every candidate")
                }
            }
        }
        // Every candidate, without an energy window (a candidate's energy is not the pick's) and,
        // in the sustained regime, without waiting for the steady state (up to nine waits would
        // outlast the measurement's deadline). Then the pick alone: its energy, and in the
        // sustained regime its time, settled under itself; burst keeps the candidates' time, as
        // before regimes.
        let sustained = req.regime == Regime::Sustained;
        // The candidates are not cooled either: up to nine idles of a second each for one pick.
        let each = MeasureRequest {
            settle_cap_ms: 0.0,
            hold_ms: 0.0,
            regime: Regime::Burst,
            energy_ms: 0.0,
            start_uncapped: false,
            baseline_first: false,
            ..req.clone()
        };
        let (us, kind, pick) = self.baseline(wi, &each, None);
        match pick {
            Some(p) if us.is_some() => {
                self.picks.insert(key, (p, kind.clone()));
                if (sustained || req.energy_ms > 0.0)
                    && let (Some(again), now, _) = self.baseline(wi, req, Some(p))
                {
                    self.vendor_energy_mj = timing::last_power().energy_mj;
                    let kind = if now.contains(CHECK_FAILED) { now } else { kind };
                    return (if sustained { Some(again) } else { us }, kind);
                }
            }
            _ => {
                self.picks.remove(&key);
            }
        }
        (us, kind)
    }

    /// Times the vendor library on the workload's timing set (every candidate, or `only` the one
    /// given); cross-checks its output on the check set against our reference, so a broken
    /// reference cannot pass unnoticed. Returns the time, the kind and the algorithm timed.
    fn baseline(
        &mut self,
        wi: usize,
        req: &MeasureRequest,
        only: Option<VendorPick>,
    ) -> (Option<f64>, String, Option<VendorPick>) {
        let mm = match self.workloads[wi].workload {
            Workload::Matmul(mm) => mm,
            Workload::Conv2d(conv) => {
                let only = match only {
                    Some(VendorPick::Conv(p)) => Some(p),
                    _ => None,
                };
                let (us, kind, pick) = self.conv_baseline(wi, &conv, req, only);
                return (us, kind, pick.map(VendorPick::Conv));
            }
        };
        if self.blas.is_none() {
            self.blas = Some(blas::Blas::new(&self.stream));
        }
        let blas = match self.blas.as_ref().expect("set above") {
            Ok(b) => b,
            Err(e) => return (None, format!("none: {e}"), None),
        };
        if let Some(stand_in) = blas::packed_stand_in(&mm) {
            let (us, kind) = self.packed_baseline(wi, &stand_in, req);
            return (us, kind, None);
        }
        // A fused epilogue or FP8 inputs: cuBLASLt alone (gemmEx has neither).
        if mm.types.input == DType::E5m2 {
            // Seen on an H200 (2026-11-28): no candidate of the plain or the fused plan ran.
            return (None, "none: cuBLASLt has no e5m2 x e5m2 FP8 matmul (it pairs e5m2 with e4m3 only)".into(), None);
        }
        if mm.fused() || mm.types.input.is_fp8() {
            let only = match only {
                Some(VendorPick::Lt(n)) => Some(n),
                _ => None,
            };
            return match self.fused_baseline(wi, &mm, req, only) {
                Some((us, kind, n)) => (Some(us), kind, Some(VendorPick::Lt(n))),
                None => (None, "none: cuBLASLt ran no algorithm for this fused or FP8 matmul".into(), None),
            };
        }
        // f32 data is multiplied two ways: the kind says which (the other types have one).
        let compute = |kind: String| match mm.types.input {
            DType::F32 => format!("{kind} CUBLAS_COMPUTE_32F"),
            DType::Tf32 => format!("{kind} CUBLAS_COMPUTE_32F_FAST_TF32"),
            _ => kind,
        };
        // A grouped matmul's cuBLASLt baseline is a loop of per-group picks, made afresh each time.
        if matches!(only, Some(VendorPick::Lt(_))) && !mm.groups.is_empty() {
            return match self.grouped_lt_baseline(wi, &mm, req) {
                Ok((us, kind)) => (Some(us), kind, only),
                Err(why) => (None, format!("none: {why}"), None),
            };
        }
        if let Some(VendorPick::Lt(number)) = only {
            return match self.lt_baseline(wi, &mm, None, After::Nothing, req, Some(number)) {
                Some((us, kind, _)) => (Some(us), compute(kind), only),
                None => (None, format!("none: cuBLASLt heuristic #{number} did not run again"), None),
            };
        }
        let w = &self.workloads[wi];
        let d = w.d.ptr;
        let (a, b) = w.inputs(InputSet::Check);
        let mut kind = blas::Blas::kind(&mm);
        // cuBLAS reads C from the output buffer, so seed it with C (our kernels read C separately).
        let checked = w
            .load_c_into_output(&self.stream)
            .and_then(|_| blas.gemm(&mm, a, b, d))
            .and_then(|_| w.compare(&self.stream, &req.tolerance));
        match checked {
            Ok(c) if c.failures == 0 => {}
            Ok(c) => {
                tracing::warn!(workload = %req.workload_key, failures = c.failures, max_abs = c.max_abs, "cuBLAS disagrees with the reference");
                kind.push_str(&format!(" ({CHECK_FAILED}: {} elements, max abs error {:.3e})", c.failures, c.max_abs));
            }
            Err(f) => {
                let text = f.to_string();
                if f.is_sticky() {
                    self.poisoned = true;
                }
                return (None, format!("none: {text}"), None);
            }
        }
        let (a, b) = w.inputs(InputSet::Timing);
        let timed = self.timer.time(req, |_| blas.gemm(&mm, a, b, d));
        let gemm_us = match timed {
            Ok(t) => t.time_us,
            Err(f) => {
                if f.is_sticky() {
                    self.poisoned = true;
                }
                return (None, format!("none: {f}"), None);
            }
        };
        if matches!(only, Some(VendorPick::GemmEx)) {
            return (Some(gemm_us), compute(kind), only);
        }
        let lt = if mm.groups.is_empty() {
            self.lt_baseline(wi, &mm, None, After::Nothing, req, None)
        } else {
            self.grouped_lt_baseline(wi, &mm, req)
                .map_err(|why| tracing::debug!(workload = %req.workload_key, "no cuBLASLt loop: {why}"))
                .ok()
                .map(|(us, kind)| (us, kind, 0))
        };
        let (us, kind, pick) = match lt {
            Some((us, lt_kind, number)) if us < gemm_us => (us, lt_kind, VendorPick::Lt(number)),
            _ => (gemm_us, kind, VendorPick::GemmEx),
        };
        (Some(us), compute(kind), Some(pick))
    }

    /// The baseline of a workload with packed inputs (s4, u4, b1), which cuBLAS has no GEMM for:
    /// `cublasGemmEx` on its i8 stand-in (same M, N, K, tn), timed on i8 operands of that shape
    /// filled with a constant (the time of an integer GEMM does not depend on its values) into
    /// the workload's i32 output. Its output is not checked: it is another problem's. The kind
    /// says all of this.
    fn packed_baseline(&mut self, wi: usize, stand_in: &Matmul, req: &MeasureRequest) -> (Option<f64>, String) {
        let input = self.workloads[wi].workload.types().input;
        let kind = format!("cublasGemmEx i8 (no {input} GEMM in cuBLAS; i8 operands of the same shape, unchecked)");
        let Some(blas) = self.blas.as_ref().and_then(|b| b.as_ref().ok()) else {
            return (None, "none: cuBLAS is not loaded".into());
        };
        let sized = |elems: u64| DevBuf::new(&self.ctx, elems as usize);
        let operands = sized(stand_in.m * stand_in.k).and_then(|a| Ok((a, sized(stand_in.k * stand_in.n)?)));
        let (a8, b8) = match operands {
            Ok(ab) => ab,
            Err(f) => return (None, format!("none: {f}")),
        };
        let filled = a8
            .fill_async(&self.stream, 0x13)
            .and_then(|_| b8.fill_async(&self.stream, 0x25))
            .when(|| "filling the i8 stand-in's operands".into());
        if let Err(f) = filled {
            return (None, format!("none: {f}"));
        }
        let d = self.workloads[wi].d.ptr;
        let (a, b) = (a8.ptr, b8.ptr);
        let timed = self.timer.time(req, |_| blas.gemm(stand_in, a, b, d));
        match timed {
            Ok(t) => (Some(t.time_us), kind),
            Err(f) => {
                if f.is_sticky() {
                    self.poisoned = true;
                }
                (None, format!("none: {f}"))
            }
        }
    }

    /// The baseline of a matmul with a fused epilogue or FP8 inputs: cuBLASLt with the same
    /// epilogue (`CUBLASLT_EPILOGUE_*`, the FP8 scale pointers) where it can fuse it; otherwise
    /// (a per-row scale, or no algorithm for the fused plan) cuBLASLt's plain product followed by
    /// the support module's elementwise epilogue kernel, timed together, as a framework runs it.
    /// The kind says which.
    fn fused_baseline(
        &mut self,
        wi: usize,
        mm: &Matmul,
        req: &MeasureRequest,
        only: Option<usize>,
    ) -> Option<(f64, String, usize)> {
        let v = &self.workloads[wi].vectors;
        let fused = blaslt::Fused { bias: v.bias.ptr, a_scale: v.tensor.ptr, b_scale: v.tensor_b.ptr };
        let scales = if mm.input_scale == InputScale::Tensor { ", A/B scale pointers" } else { "" };
        // The exact (erf) GELU, which cuBLASLt has no epilogue for: it fuses the rest (bias, C,
        // the scale pointers) and an elementwise kernel applies the GELU after it, as a framework
        // runs `nn.GELU()` after a linear layer.
        if mm.epilogue.activation == Activation::GeluErf && !mm.epilogue.scale {
            let rest = Matmul { epilogue: Epilogue { activation: Activation::None, ..mm.epilogue }, ..*mm };
            if let Some((us, kind, n)) = self.lt_baseline(wi, &rest, Some(fused), After::Activation, req, only) {
                let what = format!("fused CUBLASLT_EPILOGUE_{}", blaslt::epilogue_name(&rest));
                return Some((
                    us,
                    format!(
                        "{kind} ({what}{scales}) + tt_activate elementwise erf-GELU kernel (cuBLASLt has no exact GELU epilogue)"
                    ),
                    n,
                ));
            }
        }
        let why = match blaslt::fusable(mm) {
            Ok(()) => match self.lt_baseline(wi, mm, Some(fused), After::Nothing, req, only) {
                Some((us, kind, n)) => {
                    let what = format!("fused CUBLASLT_EPILOGUE_{}", blaslt::epilogue_name(mm));
                    return Some((us, format!("{kind} ({what}{scales})"), n));
                }
                None => "cuBLASLt proposed or ran no algorithm for the fused epilogue".to_string(),
            },
            Err(why) => why,
        };
        let plain = Matmul {
            alpha: 1.0,
            beta: 0.0,
            epilogue: tensortune_kernels::Epilogue::NONE,
            input_scale: InputScale::None,
            ..*mm
        };
        let (us, kind, n) = self.lt_baseline(wi, &plain, None, After::Epilogue, req, only)?;
        Some((us, format!("{kind} + tt_epilogue elementwise kernel (unfused: {why})"), n))
    }

    /// The fastest of cuBLASLt's heuristic candidates for matmul workload `wi` (or `only` the one
    /// of that number) whose output passes our check, each checked and timed as `cublasGemmEx`
    /// is: (time, kind, number). None when cuBLASLt is missing or refuses the workload, or no
    /// candidate runs and passes; the reasons go to the debug log, and the baseline is then
    /// gemmEx alone.
    /// With `fused`, the plan fuses `mm`'s epilogue; `after` says which elementwise kernel, if
    /// any, follows each run (the workload's whole epilogue, or its activation alone).
    fn lt_baseline(
        &mut self,
        wi: usize,
        mm: &Matmul,
        fused: Option<blaslt::Fused>,
        after: After,
        req: &MeasureRequest,
        only: Option<usize>,
    ) -> Option<(f64, String, usize)> {
        self.load_matmul_vendor();
        let lt = self.lt.as_ref().expect("set above").as_ref().ok()?;
        let found = lt.plan(mm, fused).and_then(|plan| plan.candidates().map(|c| (plan, c)));
        let (plan, candidates) = match found {
            Ok(found) => found,
            Err(e) => {
                tracing::debug!(workload = %req.workload_key, "no cuBLASLt candidates: {e}");
                return None;
            }
        };
        let w = &self.workloads[wi];
        let d = w.d.ptr;
        let mut best: Option<(f64, usize)> = None;
        let times_key = (baseline_key(req), fused.is_some());
        // A re-pick times again the candidates that came close the first time (all of them when
        // there was no first time in this child).
        let first = self.lt_times.get(&times_key).filter(|_| req.repick_baseline && only.is_none());
        let fastest = first.and_then(|t| t.iter().flatten().copied().reduce(f64::min));
        let close: Vec<bool> = (0..candidates.len())
            .map(|i| match (first.and_then(|t| t.get(i).copied().flatten()), fastest) {
                (Some(us), Some(f)) => us <= f * REPICK_MARGIN,
                _ => first.is_none(),
            })
            .collect();
        let mut times: Vec<Option<f64>> = vec![None; candidates.len()];
        for (i, c) in candidates.iter().enumerate() {
            let number = i + 1;
            if only.is_some_and(|n| n != number) || !close[i] {
                continue;
            }
            // As for gemmEx: C seeded into the output, then the check set; outside any graph, so
            // the algorithm's kernels are also loaded before the capture.
            let (a, b) = w.inputs(InputSet::Check);
            let checked = w
                .load_c_into_output(&self.stream)
                .and_then(|_| plan.matmul(c, a, b, d))
                .and_then(|_| after.run(w, &self.stream))
                .and_then(|_| w.compare(&self.stream, &req.tolerance));
            let timed = match checked {
                Ok(cmp) if cmp.failures > 0 => {
                    tracing::debug!(workload = %req.workload_key, candidate = number, failures = cmp.failures, max_abs = cmp.max_abs, "cuBLASLt candidate skipped: its output failed our check");
                    continue;
                }
                Ok(_) => {
                    let (a, b) = w.inputs(InputSet::Timing);
                    self.timer.time(req, |s| {
                        plan.matmul(c, a, b, d)?;
                        after.run(w, s)
                    })
                }
                Err(f) => Err(f),
            };
            match timed {
                Ok(t) => {
                    tracing::debug!(workload = %req.workload_key, candidate = number, us = t.time_us, workspace = c.workspace_bytes, waves = c.waves, "cuBLASLt candidate timed");
                    times[i] = Some(t.time_us);
                    if best.is_none_or(|(us, _)| t.time_us < us) {
                        best = Some((t.time_us, number));
                    }
                }
                Err(f) => {
                    // cuBLASLt reports a fault inside its kernels as its own status: ask the
                    // driver too.
                    if f.is_sticky() || self.ctx.synchronize().is_err() {
                        tracing::warn!(workload = %req.workload_key, candidate = number, "cuBLASLt candidate lost the context: {f}");
                        self.poisoned = true;
                        break;
                    }
                    tracing::debug!(workload = %req.workload_key, candidate = number, "cuBLASLt candidate skipped: {f}");
                }
            }
        }
        if only.is_none() && !self.lt_times.contains_key(&times_key) {
            self.lt_times.insert(times_key, times);
        }
        let (us, number) = best?;
        let kind = format!("cublasLt heuristic #{number} of {}", candidates.len());
        Some((us, crate::record::with_vendor_algo(&kind, &candidates[number - 1].describe()), number))
    }

    /// Times the vendor library alone on `req`'s workload, with no kernel of ours: loads the
    /// workload as a measurement would (`req.support_cubin` is needed the first time), then times
    /// and cross-checks the baseline as [`Executor::measure`] does, afresh on every call. Returns
    /// the time in microseconds and the baseline's kind (`none: why` when there is none). For
    /// checks of the vendor path (the `cudnn_check` example).
    pub fn vendor_baseline(&mut self, req: &MeasureRequest) -> (Option<f64>, String) {
        if self.poisoned {
            return (None, "none: this child's CUDA context was lost to an earlier fault".into());
        }
        match self.workload_index(req) {
            Ok(wi) => self.timed_baseline(wi, req),
            Err(Fail(_, text)) => (None, format!("none: {text}")),
        }
    }

    /// Times one vendor algorithm alone on `req`'s workload, as a finalist round times the pick
    /// again (for `fastest`, every candidate as a trial does, or the pick alone on a request with
    /// `fresh_baseline`). For runs that hold one kernel on the GPU for seconds (the `run_one`
    /// example's `TT_VENDOR`). An algorithm the workload cannot take is an error
    /// ([`VendorAlgorithm::check`]).
    pub fn vendor_alone(
        &mut self,
        req: &MeasureRequest,
        algorithm: VendorAlgorithm,
    ) -> anyhow::Result<(Option<f64>, String)> {
        if self.poisoned {
            anyhow::bail!("this CUDA context was lost to an earlier fault");
        }
        algorithm.check(&req.workload).map_err(|e| anyhow::anyhow!(e))?;
        let wi = self.workload_index(req).map_err(|Fail(_, text)| anyhow::anyhow!(text))?;
        match algorithm.0 {
            Some(only) => {
                let (us, kind, _) = self.baseline(wi, req, Some(only));
                Ok((us, kind))
            }
            // `fastest` picks as a trial does, then (with `fresh_baseline`) times that pick alone,
            // as a finalist round does: the other candidates would otherwise share the GPU's time
            // and power with it.
            None => Ok(self.timed_baseline(wi, req)),
        }
    }

    /// The board's energy counter in millijoules, when NVML can read it.
    pub fn energy_mj(&self) -> Option<u64> {
        self.timer.nvml.as_ref().and_then(|n| n.energy_mj())
    }

    /// The SM clock now, MHz (0 when NVML cannot say).
    pub fn sm_clock_mhz(&self) -> u32 {
        self.timer.nvml.as_ref().map_or(0, |n| n.sm_clock_mhz())
    }
}

impl Drop for CudaExecutor {
    fn drop(&mut self) {
        // The vendor handles go first: they are bound to `stream`, which the fields' own drop
        // order would destroy before them.
        self.dnn = None;
        self.lt = None;
        self.blas = None;
    }
}

/// What timing a launch needs of the executor: its context and stream, the L2 flush scratch
/// (allocated by the first request that flushes) and NVML (absent when it is not installed), for
/// the energy and settling probes. Apart from the executor's other fields so that a launch being
/// timed may borrow those (a workload, a vendor handle) while the timer is borrowed mutably.
struct Timer {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    l2_bytes: u64,
    flush_scratch: Option<DevBuf>,
    nvml: Option<nvml::Nvml>,
    /// A workload's reference ran since the last timing (`timing::Extra::cool_first`).
    hot: bool,
}

impl Timer {
    /// Times `enqueue` as `req` asks (see `timing`'s modes).
    fn time<F>(&mut self, req: &MeasureRequest, enqueue: F) -> Result<timing::Timing, CudaFailure>
    where
        F: FnMut(&Arc<CudaStream>) -> Result<(), CudaFailure>,
    {
        let mode = if req.flush_l2 {
            if self.flush_scratch.is_none() {
                let bytes = timing::flush_bytes(self.l2_bytes);
                self.flush_scratch = Some(DevBuf::new(&self.ctx, bytes)?);
                tracing::debug!(mib = bytes >> 20, "allocated the L2 flush scratch");
            }
            timing::Mode::ColdL2 { scratch: self.flush_scratch.as_ref().expect("allocated above") }
        } else {
            timing::Mode::Batched { min_sample_ms: req.min_sample_ms, launches: req.sample_launches }
        };
        let extra = timing::Extra {
            probe: self.nvml.as_ref().map(|n| n as &dyn timing::Probe),
            energy_ms: req.energy_ms,
            settle: (req.regime == Regime::Sustained || req.hold_ms > 0.0)
                .then(|| (crate::energy::SteadyRule::default(), req.settle_cap_ms)),
            hold_ms: req.hold_ms,
            cool_first: std::mem::take(&mut self.hot),
            // Burst only: `timing::idle_while_capped` passes over a settled or held timing.
            start_uncapped: req.start_uncapped,
            burst: req.regime == Regime::Burst,
        };
        timing::time(&self.ctx, &self.stream, req.samples.max(1), mode, extra, enqueue)
    }
}

/// Baselines are per workload and timing mode: a cold-L2 vendor time next to a warm kernel time
/// (or the reverse) would misstate the speedup.
/// A vendor baseline's key: the workload (and regime, unless burst) and the L2 flush.
type BaselineKey = (String, bool);

fn baseline_key(req: &MeasureRequest) -> BaselineKey {
    match req.regime {
        Regime::Burst => (req.workload_key.clone(), req.flush_l2),
        // The power-capped clock: a burst time would misstate it, and the reverse.
        regime => (format!("{} {regime}", req.workload_key), req.flush_l2),
    }
}

fn launch_config(l: &crate::protocol::Launch) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (l.grid[0], l.grid[1], l.grid[2]),
        block_dim: (l.block[0], l.block[1], l.block[2]),
        shared_mem_bytes: l.smem_bytes,
    }
}

impl Executor for CudaExecutor {
    fn facts(&self) -> Device {
        self.facts.clone()
    }

    fn measure(&mut self, request: &MeasureRequest) -> MeasureOutcome {
        let start = Instant::now();
        if self.poisoned {
            return MeasureOutcome::failed(
                Status::DeviceLost,
                "this child's CUDA context was lost to an earlier fault",
            );
        }
        let mut outcome = match self.measure_inner(request) {
            Ok(o) => o,
            Err(Fail(status, text)) => {
                let mut o = MeasureOutcome::failed(status, text);
                if let Some((us, kind)) = self.baselines.get(&baseline_key(request)) {
                    o.baseline_us = *us;
                    o.baseline_kind = kind.clone();
                }
                o
            }
        };
        outcome.measure_ms = start.elapsed().as_secs_f64() * 1e3;
        if !request.baseline && !self.poisoned && request.workload_key.starts_with("matmul/") {
            self.load_matmul_vendor();
        }
        outcome
    }

    fn support_loaded(&self) -> Vec<String> {
        self.workloads.iter().map(|w| w.workload.key()).collect()
    }

    fn poisoned(&self) -> bool {
        self.poisoned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendor_algorithms_parse_or_say_what_is_allowed() {
        assert!(matches!("fastest".parse::<VendorAlgorithm>(), Ok(VendorAlgorithm(None))));
        assert!(matches!("gemmex".parse::<VendorAlgorithm>(), Ok(VendorAlgorithm(Some(VendorPick::GemmEx)))));
        assert!(matches!("lt:1".parse::<VendorAlgorithm>(), Ok(VendorAlgorithm(Some(VendorPick::Lt(1))))));
        assert!(matches!("lt:8".parse::<VendorAlgorithm>(), Ok(VendorAlgorithm(Some(VendorPick::Lt(8))))));
        for bad in ["lt:0", "lt:9", "lt:x", "lt:"] {
            let e = bad.parse::<VendorAlgorithm>().unwrap_err();
            assert!(e.contains("1 to 8") && e.contains(bad), "{bad}: {e}");
        }
        for bad in ["", "gemm", "cublas:1", "gemmex:1"] {
            let e = bad.parse::<VendorAlgorithm>().unwrap_err();
            assert!(e.contains("expected fastest, gemmex or lt:N"), "{bad}: {e}");
        }
        // cuBLAS's algorithms time matmuls only; fastest takes any workload.
        let conv = Workload::from_key("conv2d/n1h8w8c64/k64r3s3/pad1x1,stride1x1,dil1x1/nhwc/f16,f32,f16").unwrap();
        let mm = Workload::from_key("matmul/m64n64k64/nn/f16,f32,f32/alpha=1,beta=0").unwrap();
        for (algo, named) in [("gemmex", "gemmex"), ("lt:3", "lt:3")] {
            let a = algo.parse::<VendorAlgorithm>().unwrap();
            let e = a.check(&conv).unwrap_err();
            assert!(e.starts_with(&format!("{named:?}")) && e.contains("takes fastest"), "{e}");
            assert!(a.check(&mm).is_ok());
        }
        let fastest = "fastest".parse::<VendorAlgorithm>().unwrap();
        assert!(fastest.check(&conv).is_ok() && fastest.check(&mm).is_ok());
    }
}
