//! Record packs: measurements of the current templates, made on one GPU by `scripts/sweep.sh`,
//! that a tracker's model tuner uses as its transfer prior before its own store holds any (as
//! TVM's TopHub gives a fresh installation the configs others found). A pack is the JSON lines
//! of `tensortune records export` (or the trimmed lines under `search/testdata/`): workload,
//! template, template_version, config, device_class, status, median_us.
//!
//! Pack records serve the prior only: they were measured on another machine, so they are never
//! reused as a trial's measurement and never answer `best`. The packs a tracker ships with are
//! part of its binary: it parses them once per process, in the background from its start
//! ([`shipped`]), and reads them from memory, unless `--no-prior-pack`; `tensortune records
//! import` stores others in their own table. The prior takes pack records of the job's device class, or of another class of the
//! same architecture where the job's has none of that workload (an H200 store starts warm from
//! H100 records and the other way round: the features are computed for the job's device). Where
//! no shipped pack holds the job's architecture, the shipped prior is the nearest architecture's
//! (`nearest_arch`), featurised for the job's device likewise.

use std::collections::HashMap;
use std::io::{BufRead, Read};

use std::sync::OnceLock;

use tensortune_kernels::{Template, Workload, registry};
use tensortune_search::records::RecordLine;

use crate::error::{Error, Result};
use crate::model::Status;
use crate::store::Json;
use crate::store::packs::PackRecord;
use crate::store::records::PriorRecord;

/// The packs this build ships (`search/testdata/`), by name.
pub(crate) const SHIPPED: &[(&str, &[u8])] = &[
    (
        "shipped:sweep-h200-union-v19-matmul",
        include_bytes!("../../search/testdata/sweep-h200-union-v19-matmul.jsonl.gz"),
    ),
    (
        "shipped:sweep-h200-union-v19-conv2d",
        include_bytes!("../../search/testdata/sweep-h200-union-v19-conv2d.jsonl.gz"),
    ),
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

/// Imported pack records a prior reads per template at most (the prior then keeps the rows of
/// the workloads nearest the job's, `search::prior`).
pub(crate) const PRIOR_PACK_RECORDS: u32 = 50_000;

/// A shipped pack's record as a prior reads it.
pub(crate) struct Shipped {
    template: String,
    template_version: u32,
    device_class: String,
    record: PriorRecord,
}

/// The records of the shipped packs of the templates' current versions (a prior reads no other),
/// parsed on first use and kept for the life of the process. A shipped pack that does not parse
/// (a unit test checks that each does) is left out, with an error in the log.
pub(crate) fn shipped() -> &'static [Shipped] {
    static RECORDS: OnceLock<Vec<Shipped>> = OnceLock::new();
    RECORDS.get_or_init(|| {
        // Each pack on a thread of its own, reading only the records of current versions: the
        // first job of a fresh tracker waits for these.
        let current =
            |template: &str, version: u32| registry::by_name(template).is_ok_and(|t| t.records_hold_for(version));
        let parsed: Vec<(&str, Result<Parsed>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = SHIPPED
                .iter()
                .map(|(name, bytes)| (*name, scope.spawn(move || parse_where(bytes, name, current))))
                .collect();
            handles.into_iter().map(|(name, h)| (name, h.join().expect("parsing a pack does not panic"))).collect()
        });
        let mut out = Vec::new();
        for (name, result) in parsed {
            match result {
                Ok(parsed) => out.extend(parsed.records.into_iter().map(|r| Shipped {
                    record: PriorRecord {
                        workload_key: r.workload_key,
                        workload: Json(r.workload),
                        config: r.config,
                        status: r.status,
                        median_us: r.median_us,
                    },
                    template: r.template,
                    template_version: r.template_version,
                    device_class: r.device_class,
                })),
                Err(e) => tracing::error!(pack = name, "a shipped record pack does not parse: {e}"),
            }
        }
        tracing::info!(records = out.len(), "shipped record packs parsed for the transfer prior");
        out
    })
}

/// Starts parsing the shipped packs on a thread of its own, off the request path, so that the
/// first model job's prior does not wait for them; once per process (later calls do nothing). A
/// thread nobody joins: it only fills the process-wide cache of [`shipped`] (a prior that needs
/// it first waits for it), and a shutdown must not wait for it. The tracker calls it when a
/// device class that takes shipped records ([`takes_shipped`]) is in its store or registers, and
/// the client when it starts a GPU worker beside an embedded tracker: a tracker that only ever
/// serves `sim` workers never parses them.
pub fn warm() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        if let Err(e) = std::thread::Builder::new().name("record-packs".into()).spawn(|| shipped().len()) {
            tracing::warn!("the record packs are parsed on first use instead: no thread for it ({e})");
        }
    });
}

/// Whether jobs on device class `class` take shipped records (it names an architecture, as a GPU's
/// class does; `sim` does not).
pub(crate) fn takes_shipped(class: &str) -> bool {
    arch(class).is_some()
}

/// The shipped records of `template` (its version) on device classes of `class`'s architecture,
/// or where no shipped pack holds that architecture, of the nearest one that has records
/// ([`nearest_arch`]: an sm_89 class starts from sm_90 records, re-featurised for its own device,
/// the configs its space does not hold skipped); leaving out the workloads in `exclude` (sorted):
/// with each record's device class.
pub(crate) fn shipped_prior(
    shipped: &[Shipped],
    template: &dyn Template,
    class: &str,
    exclude: &[String],
) -> Vec<(String, PriorRecord)> {
    let of_template =
        || shipped.iter().filter(|s| s.template == template.name() && template.records_hold_for(s.template_version));
    let Some(arch) = nearest_arch(class, of_template().filter_map(|s| self::arch(&s.device_class))) else {
        return Vec::new();
    };
    of_template()
        .filter(|s| self::arch(&s.device_class) == Some(arch))
        .filter(|s| exclude.binary_search(&s.record.workload_key).is_err())
        .map(|s| (s.device_class.clone(), s.record.clone()))
        .collect()
}

/// What a pack file held.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    /// Its valid records.
    pub(crate) records: Vec<PackRecord>,
    /// Records of templates this build does not know (a newer tracker's pack), skipped.
    pub(crate) unknown_template: u64,
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
    parse_where(bytes, origin, |_, _| true)
}

/// [`parse`], keeping only the records whose template and version pass `keep` (the others are
/// read no further than those two fields, and not checked). The lines are parsed in chunks, a
/// thread each: the first model job of a fresh tracker waits for the shipped packs.
fn parse_where(bytes: &[u8], origin: &str, keep: impl Fn(&str, u32) -> bool + Sync) -> Result<Parsed> {
    let mut text = Vec::new();
    let reader: Box<dyn Read + '_> =
        if bytes.starts_with(&[0x1f, 0x8b]) { Box::new(flate2::read::GzDecoder::new(bytes)) } else { Box::new(bytes) };
    std::io::BufReader::new(reader).read_to_end(&mut text).map_err(|e| Error::Invalid {
        field: "records".to_owned(),
        message: format!("{origin}: not a readable pack: {e}"),
    })?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(PARSE_THREADS);
    let chunks = line_chunks(&text, text.len().div_ceil(threads).max(1));
    let keep = &keep;
    let parts: Vec<Result<Parsed>> = std::thread::scope(|scope| {
        let handles: Vec<_> =
            chunks.iter().map(|&(first, chunk)| scope.spawn(move || parse_lines(chunk, first, origin, keep))).collect();
        handles.into_iter().map(|h| h.join().expect("parsing pack lines does not panic")).collect()
    });
    let mut out = Parsed::default();
    for part in parts {
        let part = part?;
        out.records.extend(part.records);
        out.unknown_template += part.unknown_template;
    }
    Ok(out)
}

/// Most threads one pack is parsed on.
const PARSE_THREADS: usize = 8;

/// `text` cut at line ends into pieces of about `size` bytes, each with the number of lines before it.
fn line_chunks(text: &[u8], size: usize) -> Vec<(usize, &[u8])> {
    let mut out = Vec::new();
    let (mut start, mut lines) = (0, 0);
    while start < text.len() {
        let end = match text[(start + size).min(text.len())..].iter().position(|b| *b == b'\n') {
            Some(i) => (start + size).min(text.len()) + i + 1,
            None => text.len(),
        };
        out.push((lines, &text[start..end]));
        lines += text[start..end].iter().filter(|b| **b == b'\n').count();
        start = end;
    }
    out
}

/// The records of `text`, lines of a pack whose first is line `first` + 1 of `origin`.
fn parse_lines(text: &[u8], first: usize, origin: &str, keep: &impl Fn(&str, u32) -> bool) -> Result<Parsed> {
    let mut out = Parsed::default();
    // Records of one workload share its parsed form: a pack holds thousands per workload.
    let mut workloads: HashMap<String, (Workload, String, String)> = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let bad = |what: String| Error::Invalid {
            field: "records".to_owned(),
            message: format!("{origin}:{}: {what}", first + n + 1),
        };
        let line = line.map_err(|e| bad(e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let l = RecordLine::parse(&line).map_err(|e| bad(format!("not a record: {e}")))?;
        if !keep(&l.template, l.template_version) {
            continue;
        }
        let (workload, workload_key, workload_json) = match workloads.get(&l.workload) {
            Some(parsed) => parsed.clone(),
            None => {
                let workload = Workload::from_key(&l.workload).map_err(|e| bad(format!("workload: {e}")))?;
                let (key, json) = (workload.key(), crate::store::json(&workload));
                let parsed = (workload, key, json);
                workloads.insert(l.workload.clone(), parsed.clone());
                parsed
            }
        };
        if registry::by_name(&l.template).is_err() {
            out.unknown_template += 1;
            continue;
        }
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
            workload_key,
            workload_json,
            workload,
            template: l.template,
            template_version: l.template_version,
            config: l.config.to_json(),
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
    Some(format!("%/{}/%", arch(class)?))
}

/// The architecture part of a device class (`name/sm90/132sm` -> `sm90`).
fn arch(class: &str) -> Option<&str> {
    class
        .split('/')
        .find(|part| part.starts_with("sm") && part.len() > 2 && part[2..].chars().all(|c| c.is_ascii_digit()))
}

/// Of the architectures in `have`, the one whose records `class` takes: its own when present,
/// else the nearest compute capability of its major version (sm_86 takes sm_80), else the nearest
/// of any (the newer on a tie); `None` for `sim`, a class without an architecture, or nothing to
/// take.
fn nearest_arch<'a>(class: &str, have: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let number = |arch: &str| arch[2..].parse::<i64>().ok();
    let own = number(arch(class)?)?;
    have.into_iter()
        .filter_map(|a| Some((number(a)?, a)))
        .min_by_key(|&(n, _)| (n / 10 != own / 10, (n - own).abs(), -n))
        .map(|(_, a)| a)
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
        let e = parse(good.replace("\"config\":{}", "\"config\":[1]").as_bytes(), "p").unwrap_err().to_string();
        assert!(e.contains("p:1") && e.contains("config"), "{e}");
        let unknown = parse(good.replace("wmma_gemm", "future_gemm").as_bytes(), "p").unwrap();
        assert_eq!((unknown.records.len(), unknown.unknown_template), (0, 1));
    }

    #[test]
    fn lines_are_cut_into_chunks_that_keep_every_line_and_its_number() {
        let text = b"a\nbb\nccc\n\ndddd";
        for size in 1..=text.len() + 1 {
            let mut at = 0;
            for (first, chunk) in line_chunks(text, size) {
                // Each piece starts where the last ended, at a line start, and knows how many
                // lines came before it.
                assert_eq!(chunk, &text[at..at + chunk.len()], "size {size}");
                assert!(at == 0 || text[at - 1] == b'\n', "size {size}: {chunk:?}");
                assert_eq!(first, text[..at].iter().filter(|b| **b == b'\n').count(), "size {size}");
                at += chunk.len();
            }
            assert_eq!(at, text.len(), "size {size}");
        }
        assert!(line_chunks(b"", 4).is_empty());
    }

    #[test]
    fn classes_of_one_architecture_share_a_pattern() {
        assert_eq!(arch_pattern("nvidia-h200/sm90/132sm").as_deref(), Some("%/sm90/%"));
        assert_eq!(arch_pattern("nvidia-h100-80gb-hbm3/sm90/132sm"), arch_pattern("nvidia-h200/sm90/132sm"));
        assert_eq!(arch_pattern("sim"), None);
        assert_eq!(arch_pattern("odd/sm/1sm"), None);
    }

    #[test]
    fn a_class_takes_its_own_architecture_else_the_nearest() {
        let have = ["sm80", "sm90", "sm90", "sm100"];
        assert_eq!(nearest_arch("nvidia-h100/sm90/132sm", have), Some("sm90"));
        assert_eq!(nearest_arch("nvidia-l40s/sm89/142sm", have), Some("sm80"), "its major version first");
        assert_eq!(nearest_arch("nvidia-l40s/sm89/142sm", ["sm90", "sm100"]), Some("sm90"));
        assert_eq!(nearest_arch("nvidia-a10/sm86/72sm", have), Some("sm80"));
        assert_eq!(nearest_arch("x/sm95/1sm", ["sm90", "sm100"]), Some("sm90"));
        assert_eq!(nearest_arch("x/sm75/1sm", ["sm70", "sm80"]), Some("sm70"));
        assert_eq!(nearest_arch("x/sm55/1sm", ["sm40", "sm70"]), Some("sm70"), "a tie goes to the newer");
        assert_eq!(nearest_arch("sim", have), None);
        assert_eq!(nearest_arch("nvidia-h100/sm90/132sm", []), None);
    }

    /// A database on an H100 (or an H100 PCIe, or an L40S of another architecture) has no pack of
    /// its own class: it takes the shipped H200 records; `sim` takes none.
    #[test]
    fn classes_without_a_pack_take_the_shipped_h200_records() {
        let records = shipped();
        for name in ["wmma_gemm", "wgmma_gemm", "wmma_conv2d", "wgmma_conv2d"] {
            let template = registry::by_name(name).unwrap();
            let h200 = shipped_prior(records, template, "nvidia-h200/sm90/132sm", &[]);
            assert!(h200.len() > 1000, "{}: {} shipped H200 records", template.name(), h200.len());
            for class in ["nvidia-h100-80gb-hbm3/sm90/132sm", "nvidia-h100-pcie/sm90/114sm", "nvidia-l40s/sm89/142sm"] {
                let got = shipped_prior(records, template, class, &[]);
                assert_eq!(got.len(), h200.len(), "{class} {}", template.name());
                assert!(got.iter().all(|(c, _)| c == "nvidia-h200/sm90/132sm"), "{class}");
            }
            assert!(shipped_prior(records, template, "sim", &[]).is_empty());
            let one = h200[0].1.workload_key.clone();
            let without = shipped_prior(records, template, "nvidia-h100-pcie/sm90/114sm", std::slice::from_ref(&one));
            assert!(!without.is_empty() && without.iter().all(|(_, r)| r.workload_key != one));
        }
    }
}

#[cfg(test)]
mod profile {
    use std::time::Instant;

    use tensortune_kernels::registry::templates_for;
    use tensortune_kernels::{DType, Layout, Matmul, Op, Target, Types};

    use super::*;

    /// Where a fresh tracker's first model job spends its time before its first proposal (run
    /// with `--release -- --ignored --nocapture`; prints, asserts nothing about speed).
    #[tokio::test]
    #[ignore]
    async fn time_to_first_proposal_on_a_fresh_database() {
        let t = Instant::now();
        let lap = |what: &str, t: &mut Instant| {
            eprintln!("{what:<44} {:>8.0} ms", t.elapsed().as_secs_f64() * 1e3);
            *t = Instant::now();
        };
        let mut t0 = t;
        let records = shipped();
        lap(&format!("parse shipped packs ({} records)", records.len()), &mut t0);
        let w =
            Workload::Matmul(Matmul::new(512, 64, 512, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap());
        let target = Target::sm90();
        let templates = templates_for(Op::Matmul);
        let space = crate::search::spaces(templates.clone(), vec![w], target.clone(), true).await.unwrap();
        let space = space.into_iter().next().unwrap().unwrap();
        lap(&format!("space and features ({} candidates)", space.valid.len()), &mut t0);
        let mut parts = Vec::new();
        for slot in crate::search::slots_of(&space) {
            let t = templates[slot as usize];
            let found = shipped_prior(records, t, "nvidia-h200/sm90/132sm", &[w.key()]);
            parts.push((t, found.into_iter().map(|(_, r)| r).collect::<Vec<_>>()));
        }
        lap(&format!("pack records ({})", parts.iter().map(|p| p.1.len()).sum::<usize>()), &mut t0);
        let prior = crate::search::prior(parts, space.layout.clone().unwrap(), target, vec![w]).await.unwrap();
        lap(&format!("prior rows ({} rows)", prior.rows.len()), &mut t0);
        let cands = space.candidates.unwrap();
        let here = tensortune_search::features::workload_row(&w);
        let model = prior.model_for(&here, 1).unwrap();
        lap("fit the prior's model", &mut t0);
        let _ = model.predict(&cands.iter().map(|c| c.features.clone()).collect::<Vec<_>>());
        lap("predict every candidate", &mut t0);
        eprintln!("total {:.0} ms", t.elapsed().as_secs_f64() * 1e3);
    }
}
