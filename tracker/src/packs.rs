//! Record packs: measurements of the current templates, made on one GPU by `scripts/sweep.sh`,
//! that a tracker's model tuner uses as its transfer prior before its own store holds any (as
//! TVM's TopHub gives a fresh installation the configs others found). A pack is the JSON lines
//! of `tensortune records export` (or the trimmed lines under `search/testdata/`): workload,
//! template, template_version, config, device_class, status, median_us.
//!
//! Pack records live in their own table and serve the prior only: they were measured on another
//! machine, so they are never reused as a trial's measurement and never answer `best`. A
//! tracker loads the packs it ships with on the first job that can use them (a model job with
//! transfer on a GPU's device class) unless `--no-prior-pack`; `tensortune records import` adds
//! others. The prior takes pack records of the job's device class, or of another class of the
//! same architecture where the job's has none of that workload (an H200 store starts warm from
//! H100 records and the other way round: the features are computed for the job's device).

use std::io::{BufRead, Read};

use tensortune_kernels::{Config, Workload, registry};

use crate::error::{Error, Result};
use crate::model::Status;
use crate::store::packs::PackRecord;

/// The packs this build ships (`search/testdata/`), by name.
pub(crate) const SHIPPED: &[(&str, &[u8])] = &[
    (
        "shipped:sweep-h200-union-v14-matmul",
        include_bytes!("../../search/testdata/sweep-h200-union-v14-matmul.jsonl.gz"),
    ),
    (
        "shipped:sweep-h200-union-v14-conv2d",
        include_bytes!("../../search/testdata/sweep-h200-union-v14-conv2d.jsonl.gz"),
    ),
    ("shipped:sweep-h200-wmma-v6", include_bytes!("../../search/testdata/sweep-h200-wmma-v6.jsonl.gz")),
    ("shipped:exhaustive-h200-v6", include_bytes!("../../search/testdata/exhaustive-h200-v6.jsonl.gz")),
    ("shipped:sweep-h200-2", include_bytes!("../../search/testdata/sweep-h200-2.jsonl.gz")),
    ("shipped:sweep-h200-union-v6v2", include_bytes!("../../search/testdata/sweep-h200-union-v6v2.jsonl.gz")),
];

/// Pack records a prior reads per template at most. A model fit on this many rows takes about a
/// second, once per workload of a job.
pub(crate) const PRIOR_PACK_RECORDS: u32 = 50_000;

/// What a pack file held.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    /// Its valid records.
    pub(crate) records: Vec<PackRecord>,
    /// Records of templates this build does not know (a newer tracker's pack), skipped.
    pub(crate) unknown_template: u64,
}

/// One line of a pack.
#[derive(serde::Deserialize)]
struct Line {
    workload: String,
    template: String,
    template_version: u32,
    config: serde_json::Value,
    device_class: String,
    status: String,
    #[serde(default)]
    median_us: Option<f64>,
}

fn status(name: &str) -> Option<Status> {
    Some(match name {
        "ok" => Status::Ok,
        "invalid_config" => Status::InvalidConfig,
        "compile_error" => Status::CompileError,
        "launch_error" => Status::LaunchError,
        "wrong_result" => Status::WrongResult,
        "timeout" => Status::Timeout,
        "device_lost" => Status::DeviceLost,
        _ => return None,
    })
}

/// Parses a pack: JSON lines, gzip-compressed or plain (`origin` names it in errors). A line that
/// is not a valid record is an error naming the line and the field.
pub(crate) fn parse(bytes: &[u8], origin: &str) -> Result<Parsed> {
    let mut text = Vec::new();
    let reader: Box<dyn Read + '_> =
        if bytes.starts_with(&[0x1f, 0x8b]) { Box::new(flate2::read::GzDecoder::new(bytes)) } else { Box::new(bytes) };
    std::io::BufReader::new(reader).read_to_end(&mut text).map_err(|e| Error::Invalid {
        field: "records".to_owned(),
        message: format!("{origin}: not a readable pack: {e}"),
    })?;
    let mut out = Parsed::default();
    for (n, line) in text.lines().enumerate() {
        let bad = |what: String| Error::Invalid {
            field: "records".to_owned(),
            message: format!("{origin}:{}: {what}", n + 1),
        };
        let line = line.map_err(|e| bad(e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let l: Line = serde_json::from_str(&line).map_err(|e| bad(format!("not a record: {e}")))?;
        let workload = Workload::from_key(&l.workload).map_err(|e| bad(format!("workload: {e}")))?;
        if registry::by_name(&l.template).is_err() {
            out.unknown_template += 1;
            continue;
        }
        let config = Config::from_json(&l.config.to_string()).map_err(|e| bad(format!("config: {e}")))?;
        let status = status(&l.status).ok_or_else(|| bad(format!("status: {:?} is not a record status", l.status)))?;
        let median_us = match (status, l.median_us) {
            (Status::Ok, Some(t)) if t.is_finite() && t > 0.0 => t,
            (Status::Ok, other) => return Err(bad(format!("median_us: an ok record needs a time > 0, not {other:?}"))),
            (_, _) => 0.0,
        };
        if l.device_class.is_empty() || l.device_class == "sim" {
            return Err(bad(format!("device_class: {:?} is not a GPU's class", l.device_class)));
        }
        out.records.push(PackRecord {
            workload_key: workload.key(),
            workload_json: crate::store::json(&workload),
            template: l.template,
            template_version: l.template_version,
            config: config.to_json(),
            device_class: l.device_class,
            status,
            median_us,
        });
    }
    Ok(out)
}

/// What one import stored.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Imported {
    pub(crate) added: u64,
    pub(crate) skipped: u64,
    pub(crate) unknown_template: u64,
}

impl crate::tracker::Tracker {
    /// Stores `lines` (pack records, see [`parse`]) under `pack` (admin only): in one write, so a
    /// call either stores all its new records or none.
    pub(crate) async fn import_pack(&self, pack: &str, lines: &[u8], caller: &crate::auth::Caller) -> Result<Imported> {
        caller.require_admin("importing records")?;
        let owned = lines.to_vec();
        let origin = format!("pack {pack:?}");
        let parsed = tokio::task::spawn_blocking(move || parse(&owned, &origin)).await??;
        let mut w = self.write().await?;
        let mut out = Imported { unknown_template: parsed.unknown_template, ..Imported::default() };
        for r in &parsed.records {
            if crate::store::packs::insert(w.conn(), pack, r).await? {
                out.added += 1;
            } else {
                out.skipped += 1;
            }
        }
        w.commit(&self.events).await?;
        tracing::info!(pack, added = out.added, skipped = out.skipped, "record pack imported");
        Ok(out)
    }
}

/// The LIKE pattern of every device class of `class`'s architecture (`name/sm90/132sm` ->
/// `%/sm90/%`); `None` for `sim` or a class without one.
pub(crate) fn arch_pattern(class: &str) -> Option<String> {
    let arch = class.split('/').find(|part| part.starts_with("sm") && part[2..].chars().all(|c| c.is_ascii_digit()))?;
    Some(format!("%/{arch}/%"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_pack_parses_and_holds_gpu_records() {
        for (name, bytes) in SHIPPED {
            let p = parse(bytes, name).unwrap();
            assert!(p.records.len() > 1000, "{name}: {} records", p.records.len());
            assert!(p.records.iter().all(|r| arch_pattern(&r.device_class).is_some()), "{name}");
            assert!(p.records.iter().any(|r| r.status == Status::Ok), "{name}");
        }
    }

    #[test]
    fn a_bad_line_names_its_line_and_field() {
        let good = r#"{"workload":"matmul/m512n64k512/nn/f16,f32,f32/alpha=1,beta=0","template":"wmma_gemm","template_version":6,"config":{},"device_class":"nvidia-h100/sm90/132sm","status":"ok","median_us":3.1}"#;
        let text = format!("{good}\n{}\n", good.replace("\"ok\"", "\"fine\""));
        let e = parse(text.as_bytes(), "p.jsonl").unwrap_err().to_string();
        assert!(e.contains("p.jsonl:2") && e.contains("status"), "{e}");
        let e = parse(good.replace("3.1", "-1").as_bytes(), "p").unwrap_err().to_string();
        assert!(e.contains("median_us"), "{e}");
        let e = parse(good.replace("nvidia-h100/sm90/132sm", "sim").as_bytes(), "p").unwrap_err().to_string();
        assert!(e.contains("device_class"), "{e}");
        let unknown = parse(good.replace("wmma_gemm", "future_gemm").as_bytes(), "p").unwrap();
        assert_eq!((unknown.records.len(), unknown.unknown_template), (0, 1));
    }

    #[test]
    fn classes_of_one_architecture_share_a_pattern() {
        assert_eq!(arch_pattern("nvidia-h200/sm90/132sm").as_deref(), Some("%/sm90/%"));
        assert_eq!(arch_pattern("nvidia-h100-80gb-hbm3/sm90/132sm"), arch_pattern("nvidia-h200/sm90/132sm"));
        assert_eq!(arch_pattern("sim"), None);
    }
}
