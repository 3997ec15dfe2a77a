//! `tensortune export`: the best trusted kernel of each workload per device class, as a bundle
//! directory a program uses without tensortune (`tensortune-bundle` in Rust,
//! `tensortune_bundle.h` in C): `manifest.json` (format 1), `index.txt`, and per kernel
//! `<name>.cu` and `<name>.<arch>.cubin`.
//!
//! Each kernel is generated again from its record (template, version, config) for the limits of
//! its device class as the tracker stored them, so the source, grid and parameters are exactly
//! what the worker measured; the cubin is compiled with the worker's NVRTC path and flags.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use tensortune_bundle::manifest::{FORMAT, INDEX, MANIFEST, Manifest, Provenance};
use tensortune_bundle::{Bundle, Device, Entry, Launch, Problem};
use tensortune_kernels::support::operand_elements;
use tensortune_kernels::{Config, KernelSpec, Target, Workload, registry, short_digest};
use tensortune_proto::{convert, pb};
use tensortune_worker::nvrtc;

use crate::cli::ExportArgs;
use crate::commands::{open, status_error};

/// `tensortune export ...`
pub async fn run(tracker: Option<&str>, db: &Path, args: &ExportArgs) -> anyhow::Result<()> {
    let workloads = workloads_of(tracker, db, args).await?;
    let mut session = open(tracker, db, None).await?;
    let answers = async {
        let mut out = Vec::with_capacity(workloads.len());
        for w in &workloads {
            let request = pb::QueryBestRequest {
                workload: Some(pb::Workload::from(w)),
                device_class: args.device_class.clone().unwrap_or_default(),
                ..Default::default()
            };
            out.push(session.client.query_best(request).await.map_err(status_error)?.into_inner());
        }
        anyhow::Ok(out)
    }
    .await;
    session.close().await?;
    let answers = answers?;
    let missing: Vec<String> =
        workloads.iter().zip(&answers).filter(|(_, a)| a.best.is_empty()).map(|(w, _)| w.key()).collect();
    if !missing.is_empty() && args.skip_untuned {
        // A model's untuned workloads keep the vendor's op (`tensortune.torch.apply`).
        eprintln!("left out, with no trusted ok record: {}", missing.join(", "));
    } else if !missing.is_empty() {
        let class = args.device_class.as_deref().map(|c| format!(" on device class {c:?}")).unwrap_or_default();
        bail!(
            "no trusted ok record{class} for {} of the {} workloads, so nothing was exported: {}; tune them first \
             (untrusted records are never exported)",
            missing.len(),
            workloads.len(),
            missing.join(", ")
        );
    }

    let compiler = if args.no_cubin { None } else { Some(Compiler::find()?) };
    let mut kernels = Vec::new();
    let mut sources: BTreeMap<String, String> = BTreeMap::new();
    for (workload, answer) in workloads.iter().zip(&answers) {
        if answer.devices.len() != answer.best.len() {
            bail!(
                "the tracker answered {} records but {} device classes; is it older than this client?",
                answer.best.len(),
                answer.devices.len()
            );
        }
        for (record, device) in answer.best.iter().zip(&answer.devices) {
            let (entry, source) = entry_of(workload, record, device)
                .with_context(|| format!("cannot export record {} of {}", record.id, record.workload_key))?;
            let mut entry = entry;
            // Names are unique per (template, workload, knobs); the same config generated for two
            // device classes may differ (persistent grids), so a clash gets the class's digest.
            if sources.get(&entry.name).is_some_and(|s| *s != source) {
                entry.name = format!("{}_{}", entry.name, short_digest(&entry.device.class_key));
            }
            entry.source = format!("{}.cu", entry.name);
            sources.insert(entry.name.clone(), source);
            kernels.push(entry);
        }
    }

    std::fs::create_dir_all(&args.output).with_context(|| format!("cannot create {}", args.output.display()))?;
    let mut nvrtc_version = String::new();
    let mut nvrtc_flags = Vec::new();
    for entry in &mut kernels {
        let source = &sources[&entry.name];
        write(&args.output, &entry.source, source.as_bytes())?;
        if let Some(c) = &compiler {
            let target_arch = nvrtc_arch(entry.device.arch);
            let compiled = nvrtc::compile(source, &entry.name, &target_arch, &c.include)
                .with_context(|| format!("nvrtc could not compile {} for {target_arch}", entry.name))?;
            let file = format!("{}.{target_arch}.cubin", entry.name);
            write(&args.output, &file, &compiled.cubin)?;
            entry.cubins.insert(target_arch.clone(), file);
            nvrtc_version.clone_from(&c.version);
            nvrtc_flags = nvrtc::flags(&target_arch, &c.include)
                .into_iter()
                .filter(|f| !f.starts_with("--gpu-architecture") && !f.starts_with("-I"))
                .collect();
        }
    }
    let manifest = Manifest {
        format: FORMAT,
        generator: format!("tensortune {}", env!("CARGO_PKG_VERSION")),
        created_ms: now_ms(),
        nvrtc_version,
        nvrtc_flags,
        kernels,
    };
    write(&args.output, MANIFEST, (serde_json::to_string_pretty(&manifest)? + "\n").as_bytes())?;
    write(&args.output, INDEX, Bundle::index_text(&manifest).as_bytes())?;

    if args.json {
        println!("{}", serde_json::to_string_pretty(&manifest)?);
        return Ok(());
    }
    println!(
        "{:<12}  {:>10}  {:>10}  {:<28}  {:<12}  workload",
        "template", "time", "vendor", "device class", "cubins"
    );
    for e in &manifest.kernels {
        let cubins: Vec<&str> = e.cubins.keys().map(String::as_str).collect();
        println!(
            "{:<12}  {:>10}  {:>10}  {:<28}  {:<12}  {}",
            e.template,
            crate::report::fmt_us(e.time_us),
            e.vendor_us.map(crate::report::fmt_us).unwrap_or_else(|| "-".into()),
            e.device.class_key,
            if cubins.is_empty() { "none".to_string() } else { cubins.join(",") },
            e.workload_key
        );
    }
    println!("{} kernels written to {}", manifest.kernels.len(), args.output.display());
    Ok(())
}

/// NVRTC's architecture for compute capability `arch` (the worker's: `sm_90a` on sm_90).
fn nvrtc_arch(arch: u32) -> String {
    Target { arch, ..Target::sm90() }.nvrtc_arch()
}

/// NVRTC and the CUDA headers, found before anything is written.
struct Compiler {
    include: std::path::PathBuf,
    version: String,
}

impl Compiler {
    fn find() -> anyhow::Result<Compiler> {
        let toolchain = nvrtc::find().map_err(|why| {
            anyhow::anyhow!("export compiles cubins with NVRTC: {why}; or pass --no-cubin to export sources only")
        })?;
        Ok(Compiler { include: toolchain.include_dir, version: toolchain.version })
    }
}

/// The workloads the flags name.
async fn workloads_of(tracker: Option<&str>, db: &Path, args: &ExportArgs) -> anyhow::Result<Vec<Workload>> {
    let mut out = Vec::new();
    for key in &args.workload {
        out.push(Workload::from_key(key).map_err(|e| anyhow::anyhow!("invalid --workload {key:?}: {e}"))?);
    }
    if let Some(path) = &args.suite {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        out.extend(crate::bench::Suite::parse(&text, &path.display().to_string())?.1);
    }
    if let Some(id) = args.job {
        let mut session = open(tracker, db, None).await?;
        let job = session.client.get_job(pb::JobRef { job_id: id }).await.map_err(status_error);
        session.close().await?;
        for w in job?.into_inner().workloads {
            out.push(Workload::from_key(&w.workload_key).with_context(|| format!("job {id}'s workload"))?);
        }
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|w| seen.insert(w.key()));
    Ok(out)
}

/// The bundle entry of `record` (the best of `workload` on `device`) and its source.
pub fn entry_of(workload: &Workload, record: &pb::Record, device: &pb::DeviceInfo) -> anyhow::Result<(Entry, String)> {
    let target =
        convert::target_from_device(device).map_err(|e| anyhow::anyhow!("the device class is unusable: {e}"))?;
    let types = workload.types();
    if let Some(d) = [types.input, types.accumulator, types.output].into_iter().find(|d| bundle_dtype(*d).is_none()) {
        bail!(
            "bundles carry no {d} workloads yet (the bundle's problem has no spelling for {d}); {} stays out",
            workload.key()
        );
    }
    if let Workload::Matmul(m) = workload
        && m.input_scale != tensortune_kernels::InputScale::None
    {
        bail!(
            "bundles carry no FP8 input scales yet (the bundle's problem has no spelling for scale={}); {} stays out",
            m.input_scale.name(),
            workload.key()
        );
    }
    if let Workload::Matmul(m) = workload
        && m.multi()
    {
        bail!(
            "bundles carry no batched or grouped matmul yet (the bundle's problem has one M and no batch, and the loaders launch one problem's grid); {} stays out",
            workload.key()
        );
    }
    let t = registry::by_name(&record.template)?;
    if t.version() != record.template_version {
        bail!(
            "the record is of {} version {}; this build generates version {} (tune the workload again)",
            record.template,
            record.template_version,
            t.version()
        );
    }
    let config = Config::from_json(&record.config)?;
    t.check(workload, &config, &target)?;
    let spec = t.generate(workload, &config, &target)?;
    let m = record.measurement.clone().unwrap_or_default();
    let p = m.provenance.clone().unwrap_or_default();
    let (a, b, d) = operand_elements(workload);
    let entry = Entry {
        name: spec.name.clone(),
        workload_key: workload.key(),
        problem: problem(workload),
        template: record.template.clone(),
        template_version: record.template_version,
        config: serde_json::from_str(&record.config)?,
        device: bundle_device(&target),
        source: format!("{}.cu", spec.name),
        cubins: BTreeMap::new(),
        entry: spec.entry.clone(),
        launch: launch(&spec),
        workspace_bytes: spec.workspace_bytes,
        params: spec.args.iter().map(param).collect(),
        elements: BTreeMap::from([("a".into(), a), ("b".into(), b), ("c".into(), d), ("d".into(), d)]),
        time_us: m.median_us,
        vendor_us: m.baseline_us,
        vendor_kind: m.baseline_kind.clone(),
        winner: Entry::winner_of(m.median_us, m.baseline_us).to_owned(),
        provenance: Provenance {
            record_id: record.id,
            job_id: record.job_id,
            worker_id: record.worker_id,
            created_ms: record.created_ms,
            remeasure: record.remeasure,
            samples_us: m.samples_us.clone(),
            batch: m.batch,
            worker_name: p.worker_name,
            gpu_name: p.gpu_name,
            gpu_uuid: p.gpu_uuid,
            driver_version: p.driver_version,
            cuda_version: p.cuda_version,
            nvrtc_version: p.nvrtc_version,
        },
    };
    Ok((entry, spec.source))
}

/// The device class a bundle entry names: the class, name, architecture and SM count of `target`
/// (its limits stay with the tracker).
pub fn bundle_device(target: &Target) -> Device {
    Device {
        class_key: target.class_key.clone(),
        name: target.name.clone(),
        arch: target.arch,
        sm_count: target.sm_count,
    }
}

/// The bundle's spelling of a matmul layout.
pub fn bundle_layout(l: tensortune_kernels::Layout) -> tensortune_bundle::Layout {
    use tensortune_bundle::Layout as B;
    use tensortune_kernels::Layout as K;
    match l {
        K::Nn => B::Nn,
        K::Nt => B::Nt,
        K::Tn => B::Tn,
        K::Tt => B::Tt,
    }
}

/// How `spec` is launched.
pub fn launch(spec: &KernelSpec) -> Launch {
    Launch { grid: spec.grid, block: spec.block, dynamic_smem_bytes: spec.smem_bytes, cluster: spec.cluster_dims() }
}

pub use tensortune_worker::params::param;
use tensortune_worker::params::{bundle_dtype, dtype};

/// The problem a workload states.
pub fn problem(w: &Workload) -> Problem {
    let t = w.types();
    // A problem names its types as the workload does (tf32 stays tf32); a packed type, which a
    // bundle cannot state (export refuses it), reads as the bytes it is stored in.
    let named = |d| bundle_dtype(d).unwrap_or_else(|| dtype(d));
    let (input, accumulator, output) = (named(t.input), named(t.accumulator), named(t.output));
    match w {
        Workload::Matmul(m) => Problem::Matmul {
            m: m.m,
            n: m.n,
            k: m.k,
            layout: bundle_layout(m.layout),
            input,
            accumulator,
            output,
            alpha: m.alpha,
            beta: m.beta,
            epilogue: tensortune_bundle::ConvEpilogue {
                scale: m.epilogue.scale,
                bias: m.epilogue.bias,
                residual: false,
                activation: bundle_activation(m.epilogue.activation),
            },
        },
        Workload::Conv2d(c) => Problem::Conv2d {
            n: c.n,
            h: c.h,
            w: c.w,
            c: c.c,
            k: c.k,
            r: c.r,
            s: c.s,
            pad: [c.pad.0, c.pad.1],
            stride: [c.stride.0, c.stride.1],
            dilation: [c.dilation.0, c.dilation.1],
            input,
            accumulator,
            output,
            epilogue: tensortune_bundle::ConvEpilogue {
                scale: c.epilogue.scale,
                bias: c.epilogue.bias,
                residual: c.residual,
                activation: bundle_activation(c.epilogue.activation),
            },
        },
    }
}

/// The bundle's spelling of an epilogue's activation.
fn bundle_activation(a: tensortune_kernels::Activation) -> tensortune_bundle::Activation {
    match a {
        tensortune_kernels::Activation::None => tensortune_bundle::Activation::None,
        tensortune_kernels::Activation::Relu => tensortune_bundle::Activation::Relu,
        tensortune_kernels::Activation::Gelu => tensortune_bundle::Activation::Gelu,
        tensortune_kernels::Activation::GeluErf => tensortune_bundle::Activation::GeluErf,
    }
}

fn write(dir: &Path, file: &str, bytes: &[u8]) -> anyhow::Result<()> {
    let path = dir.join(file);
    std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The bundle keeps serde types of its own (a program loads it without tensortune); each domain
/// type it restates converts into it here, and these tests convert every value.
#[cfg(test)]
mod tests {
    use tensortune_kernels::{DType, Layout};

    use super::*;

    #[test]
    fn every_dtype_a_bundle_states_keeps_its_name_and_size() {
        for d in DType::ALL {
            match bundle_dtype(d) {
                Some(b) => {
                    assert_eq!(b.name(), d.name());
                    assert_eq!(b.bytes() * 8, u64::from(d.bits()), "{d}");
                    assert_eq!(dtype(d).bytes() * 8, u64::from(d.bits()), "{d}");
                }
                None => assert!(d.bits() < 8, "{d} is byte-sized but has no bundle spelling"),
            }
        }
    }

    #[test]
    fn every_activation_keeps_its_name() {
        use tensortune_kernels::Activation;
        for a in [Activation::None, Activation::Relu, Activation::Gelu, Activation::GeluErf] {
            let ours = serde_json::to_string(&a).unwrap();
            assert_eq!(serde_json::to_string(&bundle_activation(a)).unwrap(), ours, "{a:?}");
        }
    }

    #[test]
    fn every_layout_keeps_its_name() {
        for l in Layout::ALL {
            assert_eq!(bundle_layout(l).name(), l.name());
        }
    }

    #[test]
    fn launch_and_device_carry_the_spec_and_target() {
        let target = Target::sm90();
        let (workload, config) = tensortune_kernels::template::drift_reference();
        let spec = registry::by_name("wmma_gemm").unwrap().generate(&workload, &config, &target).unwrap();
        let l = launch(&spec);
        assert_eq!((l.grid, l.block, l.dynamic_smem_bytes), (spec.grid, spec.block, spec.smem_bytes));
        assert_eq!(l.cluster, spec.cluster_dims());
        let d = bundle_device(&target);
        assert_eq!((d.class_key.as_str(), d.name.as_str()), (target.class_key.as_str(), target.name.as_str()));
        assert_eq!((d.arch, d.sm_count), (target.arch, target.sm_count));
    }
}
