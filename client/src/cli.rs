//! Command-line flags. Parsing and validation happen here, first; everything else is derived from
//! the validated values afterwards.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use tensortune_kernels::energy::{self, Objective, Regime};
use tensortune_kernels::workload::{Conv2d, Layout, Matmul, Types};
use tensortune_kernels::{DType, Error, Workload};

/// tensortune: tune tensor-core kernels on one GPU or a cluster.
///
/// Without --tracker, `tune` and `bench` start an embedded tracker (SQLite file in the working
/// directory) and a local worker on the first CUDA GPU, so one command tunes a shape.
#[derive(Debug, Parser)]
#[command(name = "tensortune", version, about, long_about = None)]
pub struct Cli {
    /// Tracker to talk to, e.g. http://tracker:7070, or several comma-separated (trackers sharing
    /// one PostgreSQL database: the first that answers is used, and the next when it goes away).
    /// Without it, commands run against the local database with an embedded tracker.
    #[arg(long, global = true, env = "TENSORTUNE_TRACKER")]
    pub tracker: Option<String>,

    /// Database of the embedded tracker (ignored with --tracker) [default: tensortune.db; `bench`
    /// without it: a fresh database beside its JSON].
    #[arg(long, global = true, env = "TENSORTUNE_DB")]
    pub db: Option<PathBuf>,

    /// File holding the token for a tracker that requires one (else $TENSORTUNE_TOKEN_FILE, else
    /// $TENSORTUNE_TOKEN). Never the token itself on the command line.
    #[arg(long, global = true)]
    pub token_file: Option<PathBuf>,

    /// PEM CA that signed the tracker's certificate (for an https:// tracker).
    #[arg(long, global = true, env = "TENSORTUNE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,

    /// PEM client certificate for mutual TLS (with --tls-key).
    #[arg(long, global = true, env = "TENSORTUNE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// PEM key of --tls-cert.
    #[arg(long, global = true, env = "TENSORTUNE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Tune one workload and print the best kernel next to the vendor library's time, or (with
    /// --suite) a whole model's workloads as one job.
    Tune(Box<TuneArgs>),
    /// Write the suite of an ONNX model's matmul, batched matmul and conv2d workloads.
    Extract(ExtractArgs),
    /// Tune every workload of a suite on the local GPU and print a table (also written as JSON).
    Bench(BenchArgs),
    /// The best measured kernel for a workload, per device class.
    Best {
        /// The workload.
        #[command(subcommand)]
        workload: BestCmd,
        /// Only this device class.
        #[arg(long)]
        device_class: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List jobs, newest first.
    Jobs {
        /// Only jobs in this state (queued, running, done, cancelled, failed).
        #[arg(long)]
        state: Vec<String>,
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Print JSON (the jobs with every workload's progress and best record) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one job.
    Job {
        /// Job id.
        id: u64,
        /// Print the job as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Follow a job until it ends.
    Watch {
        /// Job id.
        id: u64,
        /// Print the job as JSON when it ends.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a job.
    Cancel {
        /// Job id.
        id: u64,
    },
    /// List the workers the tracker knows.
    Workers {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Measurement records.
    Records {
        /// What to do with them.
        #[command(subcommand)]
        command: RecordsCmd,
    },
    /// Write the best trusted kernel of workloads per device class as a bundle a program loads
    /// without tensortune: manifest.json, index.txt, <name>.cu and <name>.<arch>.cubin (see the
    /// tensortune-bundle crate and tensortune_bundle.h).
    Export(ExportArgs),
    /// Check every template on the local GPU (or the sim): every template x input type x layout
    /// and conv path, a spread of configs each, every output element checked; a table, and a
    /// non-zero exit when a kernel fails.
    Selftest(SelftestArgs),
    /// Run a worker daemon (the same as `tensortune-worker`).
    Worker(WorkerArgs),
    /// Run tuners against recorded measurements instead of a GPU and compare them.
    Replay(ReplayArgs),
    /// Draw a job's convergence or its time-energy front (--pareto), a bench run's speedups or
    /// tuners replayed on records (SVG, PNG).
    Plot(PlotArgs),
    /// Admin: distrust every record of a worker and refuse its further work (revoke its token
    /// too with `tensortune-tracker token revoke` when it is not to come back).
    Quarantine {
        /// The worker's id (`tensortune workers`).
        #[arg(long)]
        worker: u64,
        /// Why; kept with the worker and each of its records.
        #[arg(long)]
        reason: String,
    },
}

/// `tensortune plot`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["job", "records", "bench", "replay"])))]
pub struct PlotArgs {
    /// A job of the tracker: the best time so far against trials per workload, with the vendor's.
    #[arg(long)]
    pub job: Option<u64>,
    /// The same from records (`tensortune records export` output, plain or .gz; comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub records: Vec<PathBuf>,
    /// A `tensortune bench` JSON: the speedup over the vendor per workload.
    #[arg(long)]
    pub bench: Option<PathBuf>,
    /// Records to replay tuners on: the median best found / true best against trials per tuner.
    #[arg(long, value_delimiter = ',')]
    pub replay: Vec<PathBuf>,
    /// Tuners to replay, comma-separated.
    #[arg(long, default_value = "random,model", value_delimiter = ',')]
    pub tuner: Vec<String>,
    /// With --replay: also the model tuner trained on the other workloads' records.
    #[arg(long)]
    pub transfer: bool,
    /// Seeds per replayed tuner (the median is drawn).
    #[arg(long, default_value_t = 10)]
    pub seeds: u64,
    /// Trials per replay.
    #[arg(long, default_value_t = 200)]
    pub budget: usize,
    /// Batch of a replayed tuner.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Only workloads whose key contains this.
    #[arg(long)]
    pub workload: Option<String>,
    /// With --job or --records: the time-energy plane instead of convergence, every record with
    /// an energy as a point and the Pareto front (faster or cheaper than every other) joined.
    #[arg(long)]
    pub pareto: bool,
    /// The picture: a .svg or .png file.
    #[arg(long, short)]
    pub output: PathBuf,
}

/// `tensortune export`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).multiple(true).args(["workload", "suite", "job"])))]
pub struct ExportArgs {
    /// A workload key (`tensortune jobs` shows them); repeatable.
    #[arg(long)]
    pub workload: Vec<String>,
    /// Every workload of a suite file (e.g. suites/default.json).
    #[arg(long)]
    pub suite: Option<PathBuf>,
    /// Every workload of a job.
    #[arg(long)]
    pub job: Option<u64>,
    /// Only this device class (default: the best of every class that has one).
    #[arg(long)]
    pub device_class: Option<String>,
    /// The bundle directory (created; files of the same names are replaced).
    #[arg(long, short)]
    pub output: PathBuf,
    /// Write sources and the manifest only, without compiling cubins (no NVRTC needed).
    #[arg(long)]
    pub no_cubin: bool,
    /// Leave out (and name on stderr) the workloads with no trusted ok record instead of refusing:
    /// for a model's suite, whose untuned workloads keep the vendor's op.
    #[arg(long)]
    pub skip_untuned: bool,
    /// Print the manifest as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `tensortune replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Records to replay: `tensortune records export` output, plain or .gz; several files
    /// (repeated or comma-separated) are read as one. Exhaustive measurements (every valid config
    /// of a workload) are the ground truth.
    #[arg(long, required = true, value_delimiter = ',')]
    pub records: Vec<PathBuf>,
    /// Tuners to compare, comma-separated (random, grid, model, autotvm).
    #[arg(long, default_value = "random,model", value_delimiter = ',')]
    pub tuner: Vec<String>,
    /// Seeds per tuner; the table shows medians.
    #[arg(long, default_value_t = 20)]
    pub seeds: u64,
    /// Trials per run at most.
    #[arg(long, default_value_t = 1000)]
    pub budget: usize,
    /// Configs proposed at once.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Also run the model tuner with the other workloads' records as its prior (transfer).
    #[arg(long)]
    pub transfer: bool,
    /// Leave one workload out: per workload, random search over the whole space, the model tuner
    /// alone and with the other workloads' records as its prior (every --tuner besides random and
    /// model too), and how many times fewer trials than random each needs to come within 5%.
    #[arg(long, conflicts_with = "transfer")]
    pub holdout: bool,
    /// The learning curve of transfer instead: per workload, the model tuner's median trials to
    /// within 2% when the store holds only this many other workloads of its op (chosen at random
    /// per seed; 0 is the model alone), e.g. `0,4,8,16`.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["transfer", "holdout"])]
    pub prior_sizes: Vec<usize>,
    /// Only workloads whose key contains this text.
    #[arg(long)]
    pub workload: Option<String>,
    /// Write the table as JSON here too.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `tensortune records ...`
#[derive(Debug, Subcommand)]
pub enum RecordsCmd {
    /// Write records as JSON lines (stdout, or --output).
    Export {
        /// Only this workload key.
        #[arg(long)]
        workload: Option<String>,
        /// Only this device class.
        #[arg(long)]
        device_class: Option<String>,
        /// Only this job.
        #[arg(long)]
        job: Option<u64>,
        /// Only records with status ok.
        #[arg(long)]
        ok_only: bool,
        /// File to write instead of stdout.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Store a record pack (records measured elsewhere, `records export` lines, plain or .gz) as
    /// the model tuner's transfer prior: never reused as a measurement, never a `best` answer.
    /// Admin only on a tracker with tokens. Importing the same pack again stores nothing twice.
    Import {
        /// The pack file.
        file: PathBuf,
        /// The pack's name (default: the file's name without its extensions).
        #[arg(long)]
        pack: Option<String>,
    },
}

/// Where the embedded worker measures.
#[derive(Debug, Args, Clone)]
pub struct LocalDevice {
    /// Device of the embedded worker: cuda:N or sim (no GPU; analytic timings).
    #[arg(long, default_value = "cuda:0")]
    pub device: String,
    /// NVRTC threads of the embedded worker (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub compile_threads: usize,
    /// Keep compiled kernels in memory only (a cold cache, for throughput measurements).
    #[arg(long)]
    pub no_disk_cache: bool,
}

/// Job settings shared by `tune` and `bench`.
#[derive(Debug, Args, Clone)]
pub struct JobArgs {
    /// Configs to measure per workload (1 ..= 100000), capped at the valid space.
    #[arg(long, default_value_t = 100)]
    pub trials: u32,
    /// Search strategy: model (gradient-boosted trees refitted on every batch of results, started
    /// from other workloads' records), random or grid. Default: model; random for
    /// `bench --throughput`, which measures the measuring, not the search.
    #[arg(long)]
    pub tuner: Option<String>,
    /// Search one kernel template only: wmma_gemm or wgmma_gemm (Hopper, sm_90: wgmma + TMA) for
    /// matmul, wmma_conv2d for conv2d. Default for tune and bench: one space across every template
    /// that supports the workload on the GPU (matmul on sm_90: wmma_gemm and wgmma_gemm); `best`
    /// without it answers across every template.
    #[arg(long)]
    pub template: Option<String>,
    /// Tasks kept outstanding per workload (0 = tracker default).
    #[arg(long, default_value_t = 0)]
    pub batch: u32,
    /// Timing samples per measurement (0 = tracker default, 10).
    #[arg(long, default_value_t = 0)]
    pub samples: u32,
    /// Seed of the tuner (0 = random).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Device class to tune for (with --tracker; default: the only one registered).
    #[arg(long)]
    pub device_class: Option<String>,
    /// Stop a workload early after this many trials without improvement (0 = never).
    #[arg(long, default_value_t = 0)]
    pub early_stop: u32,
    /// Improvement (fraction) that counts for --early-stop.
    #[arg(long, default_value_t = 0.01)]
    pub early_stop_margin: f64,
    /// Re-measure the fastest N configs of each workload, interleaved on one worker, before naming
    /// the winner (default: the tracker's, 3; 0 = none).
    #[arg(long)]
    pub finalists: Option<u32>,
    /// Rounds of that re-measurement (0 = tracker default, 3).
    #[arg(long, default_value_t = 0)]
    pub finalist_rounds: u32,
    /// Flush the L2 cache between timing samples (each sample is then one cold launch).
    #[arg(long)]
    pub flush_l2: bool,
    /// Trials of the whole job, shared by its workloads by expected gain (0 = each workload gets
    /// --trials).
    #[arg(long, default_value_t = 0)]
    pub total_trials: u32,
    /// Do not start the model tuner from other workloads' records.
    #[arg(long)]
    pub no_transfer: bool,
    /// The clock regime to tune in: burst (each config timed right after the one before, as a
    /// latency-bound server calls it; no cool-down wait) or sustained (timed once the GPU settled
    /// at its power-capped clock under the kernel, as a training job runs it; seconds per config).
    #[arg(long, default_value = "burst", value_parser = Regime::parse)]
    pub regime: Regime,
    /// What to minimise per record: time, energy (joules per launch) or edp (energy x delay).
    #[arg(long, default_value = "time", value_parser = Objective::parse)]
    pub objective: Objective,
    /// Pick the least-energy kernel within this much of the fastest time (e.g. 3% or 0.03; 0 =
    /// off; at most 100%), among the re-measured finalists.
    #[arg(long, default_value = "0", value_parser = energy::parse_slowdown)]
    pub max_slowdown: f64,
    /// Read no energy (saves each trial's 1-1.2 s energy window; records say unknown).
    /// `bench --throughput` implies it.
    #[arg(long, conflicts_with = "energy")]
    pub no_energy: bool,
    /// Read each record's energy on a job that tunes for time in bursts, where it is not read by
    /// default: the energy window costs 1-1.2 s of GPU time a measurement, more than a
    /// short trial's whole measurement. Energy and edp objectives, --max-slowdown and the
    /// sustained regime read it anyway. Not with --flush-l2 (single cold launches read none).
    #[arg(long, conflicts_with = "flush_l2")]
    pub energy: bool,
}

impl JobArgs {
    /// Whether the job's measurements skip their energy window: asked for, or a burst job for time
    /// alone that did not ask for energy.
    pub fn skips_energy(&self) -> bool {
        let needs =
            self.energy || self.objective != Objective::Time || self.regime != Regime::Burst || self.max_slowdown > 0.0;
        self.no_energy || !needs
    }
}

/// `tensortune tune`: one workload (`tune matmul ...`, `tune conv2d ...`), or a whole model's
/// suite as one job (`tune --suite model.json --total-trials N`).
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct TuneArgs {
    /// The workload.
    #[command(subcommand)]
    pub workload: Option<WorkloadCmd>,
    /// A model's suite (what `tensortune.torch.capture` or `tensortune extract` wrote): every
    /// workload in one job, weighted by its `count`; the report sums the model's GEMM/conv time
    /// (count x the faster of the best kernel and the vendor's) as tuning proceeds and at the end.
    #[arg(long, required = true)]
    pub suite: Option<PathBuf>,
    /// Job settings (with --suite).
    #[command(flatten)]
    pub job: JobArgs,
    /// Embedded worker (with --suite; `--device cuda:all` measures on every GPU).
    #[command(flatten)]
    pub local: LocalDevice,
    /// Also write the model's table as JSON to this file (with --suite).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `tensortune extract`: the suite of an ONNX model's matmul, batched matmul and conv2d nodes.
#[derive(Debug, Args)]
pub struct ExtractArgs {
    /// The ONNX file.
    pub model: PathBuf,
    /// The batch size for a symbolic (or unknown) first input dimension, 1 ..= 65536.
    #[arg(long, default_value_t = 1)]
    pub batch: u64,
    /// Element type the model runs in: f16 or bf16 (the suite's keys take it; ONNX f32 graphs are
    /// usually run in half precision once tuned), or f32 (exact, on the CUDA cores), or as-is:
    /// the graph's own type.
    #[arg(long, default_value = "as-is")]
    pub dtype: String,
    /// The suite file to write (default: stdout).
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

/// The workload flags of `tune` and `best`.
#[derive(Debug, Subcommand, Clone)]
pub enum WorkloadCmd {
    /// A matmul: D = alpha * op(A) op(B) + beta * C (BLAS layouts, C column-major).
    Matmul {
        /// Workload shape and types.
        #[command(flatten)]
        shape: MatmulArgs,
        /// Job settings.
        #[command(flatten)]
        job: JobArgs,
        /// Embedded worker.
        #[command(flatten)]
        local: LocalDevice,
        /// Also write the result as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// A 2-D convolution (NHWC input, KRSC filter).
    Conv2d {
        /// Workload shape and types.
        #[command(flatten)]
        shape: ConvArgs,
        /// Job settings.
        #[command(flatten)]
        job: JobArgs,
        /// Embedded worker.
        #[command(flatten)]
        local: LocalDevice,
        /// Also write the result as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

impl Cli {
    /// The embedded tracker's database: `--db`, else `tensortune.db`.
    pub fn db_path(&self) -> &std::path::Path {
        self.db.as_deref().unwrap_or(std::path::Path::new("tensortune.db"))
    }
}

/// The workload of `best`: its shape and types, and the flags `best` takes after it (so that
/// `best matmul ... --json` means what it says; `tune`'s job flags have no place here).
#[derive(Debug, Subcommand, Clone)]
pub enum BestCmd {
    /// A matmul.
    Matmul {
        /// Workload shape and types.
        #[command(flatten)]
        shape: MatmulArgs,
        /// Flags of `best` given after the workload.
        #[command(flatten)]
        query: BestQuery,
    },
    /// A 2-D convolution.
    Conv2d {
        /// Workload shape and types.
        #[command(flatten)]
        shape: ConvArgs,
        /// Flags of `best` given after the workload.
        #[command(flatten)]
        query: BestQuery,
    },
}

/// `best`'s flags as they may follow the workload.
#[derive(Debug, Args, Clone, Default)]
pub struct BestQuery {
    /// Only records of this template (default: every template).
    #[arg(long)]
    pub template: Option<String>,
    /// Only this device class.
    #[arg(long = "device-class")]
    pub device_class: Option<String>,
    /// Only records timed in this regime: burst or sustained.
    #[arg(long, default_value = "burst", value_parser = Regime::parse)]
    pub regime: Regime,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl BestCmd {
    /// The validated workload and the flags given after it.
    pub fn parts(&self) -> anyhow::Result<(Workload, &BestQuery)> {
        match self {
            BestCmd::Matmul { shape, query } => Ok((shape.workload()?, query)),
            BestCmd::Conv2d { shape, query } => Ok((shape.workload()?, query)),
        }
    }
}

/// Element types.
#[derive(Debug, Args, Clone)]
pub struct TypeArgs {
    /// Input type: f16, bf16, i8, f32 (exact, on the CUDA cores; see --allow-tf32), or for tn
    /// matmul the packed s4, u4, b1xor and b1and (K a multiple of 32, or 128 for the bit types).
    /// Matmul and conv2d alike take f32 and --allow-tf32.
    #[arg(long, default_value = "f16")]
    pub dtype: String,
    /// With --dtype f32: multiply on the TF32 tensor cores (a different workload, `tf32`, whose
    /// results differ from exact f32 and are checked with TF32's tolerance).
    #[arg(long)]
    pub allow_tf32: bool,
    /// Accumulator: f32 or f16 (f16 input), f32 (bf16, f32, tf32), i32 (i8 and the packed types).
    /// Default: f32, or i32 for integer inputs.
    #[arg(long)]
    pub acc: Option<String>,
    /// Output type. Default for matmul: the accumulator's. Default for conv2d: the input type for
    /// f16 and bf16 (what cuDNN and the frameworks write), else the accumulator's.
    #[arg(long)]
    pub out: Option<String>,
}

/// Matmul shape.
#[derive(Debug, Args, Clone)]
pub struct MatmulArgs {
    /// Rows of op(A) and C.
    #[arg(long)]
    pub m: u64,
    /// Columns of op(B) and C.
    #[arg(long)]
    pub n: u64,
    /// Reduction length.
    #[arg(long)]
    pub k: u64,
    /// Layout (BLAS): nn, nt, tn or tt.
    #[arg(long, default_value = "nn")]
    pub layout: String,
    /// Types.
    #[command(flatten)]
    pub types: TypeArgs,
    /// Epilogue scale of the product.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub alpha: f64,
    /// Epilogue scale of C.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub beta: f64,
    /// Fused epilogue: none, or scale, bias, relu, gelu joined by '+' (e.g. bias+gelu).
    #[arg(long, default_value = "none")]
    pub epilogue: String,
    /// Per-tensor scales of e4m3/e5m2 inputs: none or tensor.
    #[arg(long, default_value = "none")]
    pub scale: String,
}

/// Convolution shape.
#[derive(Debug, Args, Clone)]
pub struct ConvArgs {
    /// Batch.
    #[arg(long)]
    pub n: u64,
    /// Input height.
    #[arg(long)]
    pub h: u64,
    /// Input width.
    #[arg(long)]
    pub w: u64,
    /// Input channels.
    #[arg(long)]
    pub c: u64,
    /// Output channels.
    #[arg(long)]
    pub k: u64,
    /// Filter height.
    #[arg(long, default_value_t = 1)]
    pub r: u64,
    /// Filter width.
    #[arg(long, default_value_t = 1)]
    pub s: u64,
    /// Padding (both sides, height and width).
    #[arg(long, default_value_t = 0)]
    pub pad: u64,
    /// Stride (height and width).
    #[arg(long, default_value_t = 1)]
    pub stride: u64,
    /// Dilation (height and width).
    #[arg(long, default_value_t = 1)]
    pub dilation: u64,
    /// Types.
    #[command(flatten)]
    pub types: TypeArgs,
    /// Fused epilogue per output channel: none, or scale, bias, relu, gelu joined by '+' (e.g.
    /// bias+relu: a conv with its batch norm folded into a bias, then ReLU).
    #[arg(long, default_value = "none")]
    pub epilogue: String,
    /// Add a tensor of the output's shape (a residual block's identity) before bias and
    /// activation.
    #[arg(long)]
    pub residual: bool,
}

/// `tensortune bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Suite file (JSON); default: the shipped suite (suites/default.json).
    #[arg(long, conflicts_with = "throughput")]
    pub suite: Option<PathBuf>,
    /// Measure measurement throughput instead: the shipped throughput suite (512x64x512 and 4096^3
    /// f16) with a cold compile cache, random proposals and no finalists (unless --tuner or
    /// --finalists say otherwise); the cfg/s column is the figure.
    #[arg(long)]
    pub throughput: bool,
    /// Job settings.
    #[command(flatten)]
    pub job: JobArgs,
    /// Embedded worker.
    #[command(flatten)]
    pub local: LocalDevice,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench.json")]
    pub json: PathBuf,
    /// Only workloads whose key contains this text.
    #[arg(long)]
    pub filter: Option<String>,
}

/// `tensortune selftest`.
#[derive(Debug, Args)]
pub struct SelftestArgs {
    /// Only this template (workloads it does not support are listed and skipped); default: every
    /// template that supports each workload.
    #[arg(long)]
    pub template: Option<String>,
    /// Only workloads of these input types (f16, bf16, i8, f32, tf32, s4, u4, b1xor, b1and);
    /// repeatable or comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_dtype)]
    pub dtype: Vec<DType>,
    /// These workloads (keys, as `tensortune jobs` shows them) instead of the built-in matrix;
    /// repeatable.
    #[arg(long)]
    pub workload: Vec<String>,
    /// One config (JSON, e.g. '{"bm":128,...}') of the one --workload instead of a spread: to
    /// check and time a single kernel (with --no-baseline, under compute-sanitizer).
    #[arg(long, requires = "workload")]
    pub config: Option<String>,
    /// Only configs whose knob has this value, NAME:VALUE (e.g. producer:inline); needs --template.
    #[arg(long, requires = "template")]
    pub knob: Option<String>,
    /// Configs per template and workload.
    #[arg(long, default_value_t = tensortune_worker::selftest::DEFAULT_CONFIGS)]
    pub configs: usize,
    /// Timing samples per kernel (the output is checked before and after them).
    #[arg(long, default_value_t = tensortune_worker::selftest::DEFAULT_SAMPLES)]
    pub samples: u32,
    /// Leave the vendor library out of the process (compute-sanitizer's racecheck reports inside
    /// cuBLAS's kernels otherwise).
    #[arg(long)]
    pub no_baseline: bool,
    /// Run each kernel back to back for this many seconds before its samples (0 to 600): the
    /// steady loop a sustained record is checked against; the JSON has its clock and power a
    /// point a second (polled through NVML: without it, nothing is held).
    #[arg(long, default_value_t = 0.0)]
    pub hold: f64,
    /// Read each kernel's energy per launch, mean power and clock after its samples.
    #[arg(long)]
    pub energy: bool,
    /// Time these kernels (a file of lines WORKLOAD_KEY<TAB>TEMPLATE<TAB>CONFIG_JSON, e.g. a
    /// job's finalists) in one process instead of a spread per workload.
    #[arg(long, conflicts_with_all = ["workload", "template", "knob", "config"])]
    pub list: Option<PathBuf>,
    /// Time each kernel in this clock regime, as a job's trial in it: burst, or sustained
    /// (settled under the kernel by the records' rule, the time over the energy window, the
    /// vendor settled under itself; seconds per kernel).
    #[arg(long, default_value = "burst", value_parser = Regime::parse, conflicts_with = "hold")]
    pub regime: Regime,
    /// Device: cuda:N (a GPU of this machine) or sim (no GPU: generation, NVRTC and the sim's
    /// check of each cubin; no output is verified).
    #[arg(long, default_value = "cuda:0")]
    pub device: String,
    /// Also write the report (device, rows, every kernel) as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Print a line for every kernel, not only for those that fail.
    #[arg(long, short)]
    pub verbose: bool,
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    s.parse().map_err(|e: Error| e.to_string())
}

/// `tensortune worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Device: cuda:N or sim.
    #[arg(long, default_value = "cuda:0")]
    pub device: String,
    /// Name shown by the tracker (default: host/device).
    #[arg(long)]
    pub name: Option<String>,
    /// NVRTC threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub compile_threads: usize,
    /// On-disk cache of compiled kernels.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
}

/// A flag name for a kernels-crate field name (`k` -> `--k`, `pad_h` -> `--pad`).
fn flag(field: &str) -> String {
    let f = match field {
        "pad_h" | "pad_w" => "pad",
        "stride_h" | "stride_w" => "stride",
        "dilation_h" | "dilation_w" => "dilation",
        "input" | "dtype" => "dtype",
        "accumulator" => "acc",
        "output" => "out",
        other => other,
    };
    format!("--{f}")
}

/// The kernels error with the field replaced by the flag that sets it.
fn flag_error(e: Error) -> anyhow::Error {
    match e {
        Error::Invalid { field, message } => anyhow::anyhow!("invalid {}: {message}", flag(field)),
        other => anyhow::anyhow!("{other}"),
    }
}

/// Which operation the types are for: a convolution's f16 and bf16 output defaults to its input type.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Matmul,
    Conv,
}

fn parse_types(t: &TypeArgs, op: Op) -> anyhow::Result<Types> {
    let mut input: DType = t.dtype.parse().map_err(flag_error)?;
    if t.allow_tf32 {
        if input != DType::F32 {
            anyhow::bail!("invalid --allow-tf32: TF32 math is for f32 inputs; --dtype is {input}");
        }
        input = DType::Tf32;
    }
    let acc = match &t.acc {
        Some(a) => a.parse::<DType>().map_err(|e| flag_error(rename(e, "accumulator")))?,
        None => Types::default_for(input).map_err(flag_error)?.accumulator,
    };
    let out = match t.out.as_deref() {
        Some(o) => Some(o.parse::<DType>().map_err(|e| flag_error(rename(e, "output")))?),
        None if op == Op::Conv && matches!(input, DType::F16 | DType::Bf16) => Some(input),
        None => None,
    };
    Types::new(input, acc, out).map_err(flag_error)
}

fn rename(e: Error, field: &'static str) -> Error {
    match e {
        Error::Invalid { message, .. } => Error::Invalid { field, message },
        other => other,
    }
}

impl MatmulArgs {
    /// The validated workload.
    pub fn workload(&self) -> anyhow::Result<Workload> {
        let layout: Layout = self.layout.parse().map_err(flag_error)?;
        let m = Matmul {
            m: self.m,
            n: self.n,
            k: self.k,
            layout,
            types: parse_types(&self.types, Op::Matmul)?,
            alpha: self.alpha,
            beta: self.beta,
            epilogue: self.epilogue.parse().map_err(flag_error)?,
            input_scale: self.scale.parse().map_err(flag_error)?,
            batch: 1,
            groups: Default::default(),
        };
        m.validate().map_err(flag_error)?;
        Ok(Workload::Matmul(m))
    }
}

impl ConvArgs {
    /// The validated workload.
    pub fn workload(&self) -> anyhow::Result<Workload> {
        let c = Conv2d {
            n: self.n,
            h: self.h,
            w: self.w,
            c: self.c,
            k: self.k,
            r: self.r,
            s: self.s,
            pad: (self.pad, self.pad),
            stride: (self.stride, self.stride),
            dilation: (self.dilation, self.dilation),
            types: parse_types(&self.types, Op::Conv)?,
            epilogue: self.epilogue.parse().map_err(flag_error)?,
            residual: self.residual,
        };
        c.validate().map_err(flag_error)?;
        Ok(Workload::Conv2d(c))
    }
}

impl WorkloadCmd {
    /// The validated workload.
    pub fn workload(&self) -> anyhow::Result<Workload> {
        match self {
            WorkloadCmd::Matmul { shape, .. } => shape.workload(),
            WorkloadCmd::Conv2d { shape, .. } => shape.workload(),
        }
    }

    /// Job settings, embedded worker and JSON path.
    pub fn parts(&self) -> (&JobArgs, &LocalDevice, Option<&PathBuf>) {
        match self {
            WorkloadCmd::Matmul { job, local, json, .. } | WorkloadCmd::Conv2d { job, local, json, .. } => {
                (job, local, json.as_ref())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("tensortune").chain(args.iter().copied())).unwrap()
    }

    fn workload(args: &[&str]) -> anyhow::Result<Workload> {
        match parse(args).command {
            Command::Tune(t) => t.workload.expect("a workload subcommand").workload(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn energy_is_read_where_the_job_needs_it() {
        let skips = |extra: &[&str]| match parse(
            &[&["tune", "matmul", "--m", "8", "--n", "8", "--k", "8"][..], extra].concat(),
        )
        .command
        {
            // The job's flags after the workload's subcommand belong to it.
            Command::Tune(t) => match t.workload {
                Some(WorkloadCmd::Matmul { job, .. }) => job.skips_energy(),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        };
        assert!(skips(&[]), "a burst job for time reads none by default");
        for needs in [
            &["--energy"][..],
            &["--objective", "energy"],
            &["--objective", "edp"],
            &["--regime", "sustained"],
            &["--max-slowdown", "3%"],
        ] {
            assert!(!skips(needs), "{needs:?}");
        }
        assert!(skips(&["--objective", "energy", "--no-energy"]), "--no-energy always wins");
        assert!(
            Cli::try_parse_from([
                "tensortune",
                "tune",
                "matmul",
                "--m",
                "8",
                "--n",
                "8",
                "--k",
                "8",
                "--energy",
                "--no-energy"
            ])
            .is_err()
        );
    }

    #[test]
    fn matmul_defaults() {
        let w = workload(&["tune", "matmul", "--m", "512", "--n", "64", "--k", "512"]).unwrap();
        assert_eq!(w.key(), "matmul/m512n64k512/nn/f16,f32,f32/alpha=1,beta=0");
        let w =
            workload(&["tune", "matmul", "--m", "512", "--n", "32", "--k", "512", "--dtype", "i8", "--layout", "tn"])
                .unwrap();
        assert_eq!(w.key(), "matmul/m512n32k512/tn/i8,i32,i32/alpha=1,beta=0");
    }

    #[test]
    fn bad_flags_name_the_flag() {
        let e = workload(&["tune", "matmul", "--m", "0", "--n", "64", "--k", "512"]).unwrap_err().to_string();
        assert!(e.starts_with("invalid --m:") && e.contains("1 ..= 1048576"), "{e}");
        let e = workload(&["tune", "matmul", "--m", "8", "--n", "8", "--k", "8", "--dtype", "f64"])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("invalid --dtype:"), "{e}");
        let e = workload(&["tune", "matmul", "--m", "8", "--n", "8", "--k", "8", "--dtype", "i8", "--acc", "f32"])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("invalid --acc:") && e.contains("i32"), "{e}");
        let key = |args: &[&str]| workload(args).map(|w| w.key()).map_err(|e| e.to_string());
        let f32_args = ["tune", "matmul", "--m", "64", "--n", "64", "--k", "64", "--dtype", "f32"];
        assert_eq!(key(&f32_args).unwrap(), "matmul/m64n64k64/nn/f32,f32,f32/alpha=1,beta=0");
        let tf32_args = [&f32_args[..], &["--allow-tf32"]].concat();
        assert_eq!(key(&tf32_args).unwrap(), "matmul/m64n64k64/nn/tf32,f32,f32/alpha=1,beta=0");
        let e = key(&["tune", "matmul", "--m", "64", "--n", "64", "--k", "64", "--allow-tf32"]).unwrap_err();
        assert!(e.starts_with("invalid --allow-tf32:") && e.contains("f16"), "{e}");
        let s4 = ["tune", "matmul", "--m", "64", "--n", "64", "--k", "4096", "--dtype", "s4", "--layout", "tn"];
        assert_eq!(key(&s4).unwrap(), "matmul/m64n64k4096/tn/s4,i32,i32/alpha=1,beta=0");
        let e = key(&["tune", "matmul", "--m", "64", "--n", "64", "--k", "100", "--dtype", "s4", "--layout", "tn"])
            .unwrap_err();
        assert!(e.starts_with("invalid --k:") && e.contains("multiple of 32"), "{e}");
        let e = key(&["tune", "matmul", "--m", "64", "--n", "64", "--k", "128", "--dtype", "b1xor"]).unwrap_err();
        assert!(e.starts_with("invalid --layout:") && e.contains("tn"), "{e}");
        let e = key(&["tune", "matmul", "--m", "64", "--n", "64", "--k", "128", "--dtype", "b1", "--layout", "tn"])
            .unwrap_err();
        assert!(e.starts_with("invalid --dtype:") && e.contains("b1xor"), "{e}");
        let b1 = ["tune", "matmul", "--m", "64", "--n", "64", "--k", "256", "--dtype", "b1and", "--layout", "tn"];
        assert_eq!(key(&b1).unwrap(), "matmul/m64n64k256/tn/b1and,i32,i32/alpha=1,beta=0");
        let e = workload(&["tune", "matmul", "--m", "8", "--n", "8", "--k", "8", "--layout", "xx"])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("invalid --layout:"), "{e}");
        let e = workload(&[
            "tune", "conv2d", "--n", "1", "--h", "7", "--w", "7", "--c", "16", "--k", "16", "--r", "3", "--s", "3",
            "--pad", "3",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("invalid --pad:"), "{e}");
        assert!(Cli::try_parse_from(["tensortune", "tune", "matmul", "--m", "-1", "--n", "1", "--k", "8"]).is_err());
    }

    #[test]
    fn conv2d_writes_its_input_type_by_default() {
        let key = |args: &[&str]| workload(args).map(|w| w.key()).map_err(|e| e.to_string());
        let layer = ["tune", "conv2d", "--n", "32", "--h", "56", "--w", "56", "--c", "64", "--k", "128"];
        assert_eq!(key(&layer).unwrap(), "conv2d/n32h56w56c64/k128r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16");
        let bf16 = [&layer[..], &["--dtype", "bf16"]].concat();
        assert_eq!(key(&bf16).unwrap(), "conv2d/n32h56w56c64/k128r1s1/pad0x0,stride1x1,dil1x1/nhwc/bf16,f32,bf16");
        let wide = [&layer[..], &["--out", "f32"]].concat();
        assert_eq!(key(&wide).unwrap(), "conv2d/n32h56w56c64/k128r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f32");
        let i8 = [&layer[..], &["--dtype", "i8"]].concat();
        assert_eq!(key(&i8).unwrap(), "conv2d/n32h56w56c64/k128r1s1/pad0x0,stride1x1,dil1x1/nhwc/i8,i32,i32");
    }

    #[test]
    fn conv2d_takes_exact_f32_and_tf32() {
        let key = |args: &[&str]| workload(args).map(|w| w.key()).map_err(|e| e.to_string());
        let f32_args = [
            "tune", "conv2d", "--n", "8", "--h", "56", "--w", "56", "--c", "64", "--k", "64", "--r", "3", "--s", "3",
            "--pad", "1", "--dtype", "f32",
        ];
        assert_eq!(key(&f32_args).unwrap(), "conv2d/n8h56w56c64/k64r3s3/pad1x1,stride1x1,dil1x1/nhwc/f32,f32,f32");
        let tf32_args = [&f32_args[..], &["--allow-tf32"]].concat();
        assert_eq!(key(&tf32_args).unwrap(), "conv2d/n8h56w56c64/k64r3s3/pad1x1,stride1x1,dil1x1/nhwc/tf32,f32,f32");
        let e = key(&[&tf32_args[..], &["--out", "f16"]].concat()).unwrap_err();
        assert!(e.starts_with("invalid --out:") && e.contains("allowed: f32"), "{e}");
        let e = key(&["tune", "conv2d", "--n", "1", "--h", "8", "--w", "8", "--c", "8", "--k", "8", "--allow-tf32"])
            .unwrap_err();
        assert!(e.starts_with("invalid --allow-tf32:") && e.contains("f16"), "{e}");
        let e = key(&["tune", "conv2d", "--n", "1", "--h", "8", "--w", "8", "--c", "8", "--k", "8", "--dtype", "s4"])
            .unwrap_err();
        assert!(e.starts_with("invalid --dtype:") && e.contains("tn matmul only"), "{e}");
    }

    #[test]
    fn best_takes_its_flags_before_or_after_the_workload() {
        let best = |args: &[&str]| match parse(args).command {
            Command::Best { workload, device_class, json } => {
                let (w, q) = workload.parts().unwrap();
                (w.key(), q.json || json, q.device_class.clone().or(device_class), q.template.clone())
            }
            other => panic!("{other:?}"),
        };
        let key = "matmul/m64n32k128/tn/f16,f32,f32/alpha=1,beta=0".to_string();
        let after = ["best", "matmul", "--m", "64", "--n", "32", "--k", "128", "--layout", "tn"];
        assert_eq!(best(&after), (key.clone(), false, None, None));
        let with = [&after[..], &["--json", "--device-class", "sim", "--template", "wgmma_gemm"]].concat();
        assert_eq!(best(&with), (key.clone(), true, Some("sim".into()), Some("wgmma_gemm".into())));
        let before = [&["best", "--json", "--device-class", "sim"][..], &after[1..]].concat();
        assert_eq!(best(&before), (key, true, Some("sim".into()), None));
        // tune's job flags are not best's.
        assert!(Cli::try_parse_from([&after[..], &["--trials", "5"]].concat()).is_err());
    }
}
