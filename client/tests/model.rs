//! A model's path through the CLI: `tensortune extract` on a small committed ONNX graph
//! (`data/small.onnx`, written by `data/make_small_onnx.py` without shape inference, so every shape
//! past the input is propagated), and `tune --suite` as one job on the `sim` device, then `export`.

use tensortune::bench::Suite;
use tensortune::cli::ExtractArgs;
use tensortune::extract::{extract, run};

const SMALL: &[u8] = include_bytes!("data/small.onnx");

/// (key, count, batch, epilogue) of a suite entry.
type Row = (String, Option<u64>, Option<u64>, Option<String>);

fn entries(suite: &Suite) -> Vec<Row> {
    suite.workloads.iter().map(|e| (e.workload.clone(), e.count, e.batch, e.epilogue.clone())).collect()
}

#[test]
fn the_small_graph_gives_its_workloads_with_counts_batches_and_epilogues() {
    let (suite, skipped) = extract(SMALL, "small", 4, None).unwrap();
    let s = |v: &str| Some(v.to_owned());
    assert_eq!(
        entries(&suite),
        [
            ("conv2d/n4h8w8c3/k4r3s3/pad1x1,stride1x1,dil1x1/nhwc/f32,f32,f32".into(), Some(1), None, s("relu")),
            ("conv2d/n4h8w8c4/k4r1s1/pad0x0,stride2x2,dil1x1/nhwc/f32,f32,f32".into(), Some(1), None, None),
            ("matmul/m10n4k4/tn/f32,f32,f32/alpha=1,beta=0".into(), Some(1), None, s("bias+relu")),
            ("matmul/m10n4k4/tn/f32,f32,f32/alpha=1,beta=0".into(), Some(1), None, s("bias")),
            ("matmul/m6n4k10/nn/f32,f32,f32/alpha=1,beta=0".into(), Some(1), None, s("bias")),
            ("matmul/m2n2k3/nn/f32,f32,f32/alpha=1,beta=0".into(), Some(1), Some(4), None),
        ]
    );
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(skipped[0].contains("grouped") && skipped[0].contains("group 2"), "{skipped:?}");
    assert_eq!(suite.workloads[0].ops, ["conv1"]);
    // The suite is what `tune --suite` reads.
    let text = serde_json::to_string(&suite).unwrap();
    let (_, workloads) = Suite::parse(&text, "small.json").unwrap();
    assert_eq!(workloads.len(), 6);
}

#[test]
fn the_dtype_and_batch_flags_apply() {
    let (suite, _) = extract(SMALL, "small", 32, Some("f16")).unwrap();
    assert_eq!(suite.workloads[0].workload, "conv2d/n32h8w8c3/k4r3s3/pad1x1,stride1x1,dil1x1/nhwc/f16,f32,f16");
    assert_eq!(suite.workloads[5].batch, Some(32));
}

#[test]
fn bad_input_is_explained() {
    let e = extract(b"not a model", "x", 1, None).unwrap_err();
    assert!(format!("{e:#}").contains("not an ONNX model"), "{e:#}");
    let args = |batch, dtype: &str| ExtractArgs {
        model: "tests/data/small.onnx".into(),
        batch,
        dtype: dtype.into(),
        output: Some(std::env::temp_dir().join("tensortune-extract-test.json")),
    };
    let e = run(&args(0, "as-is")).unwrap_err().to_string();
    assert!(e.contains("invalid --batch 0: allowed 1 ..= 65536"), "{e}");
    let e = run(&args(1, "f64")).unwrap_err().to_string();
    assert!(e.contains("invalid --dtype \"f64\": allowed f16, bf16, f32 or as-is"), "{e}");
    run(&args(2, "bf16")).unwrap();
}

const BIN: &str = env!("CARGO_BIN_EXE_tensortune");

#[test]
fn a_models_suite_tunes_as_one_job_on_sim_and_exports_its_winners() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("model.json");
    std::fs::write(
        &suite,
        r#"{"name": "tiny", "workloads": [
            {"workload": "matmul/m64n64k64/tn/f16,f32,f16/alpha=1,beta=0", "count": 12, "epilogue": "bias+gelu"},
            {"workload": "matmul/m128n64k64/nn/f16,f32,f16/alpha=1,beta=0", "count": 1, "batch": 3},
            {"workload": "conv2d/n1h14w14c64/k64r3s3/pad1x1,stride1x1,dil1x1/nhwc/f16,f32,f16", "count": 2}
        ]}"#,
    )
    .unwrap();
    let db = dir.path().join("tt.db");
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(BIN)
            .args(["--db", db.to_str().unwrap()])
            .args(args)
            .env("XDG_CACHE_HOME", dir.path())
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{args:?} failed:\n{stdout}\n{stderr}");
        (stdout.into_owned(), stderr.into_owned())
    };
    let report = dir.path().join("report.json");
    let (stdout, stderr) = cli(&[
        "tune",
        "--suite",
        suite.to_str().unwrap(),
        "--total-trials",
        "60",
        "--trials",
        "40",
        "--finalists",
        "0",
        "--seed",
        "3",
        "--device",
        "sim",
        "--compile-threads",
        "1",
        "--json",
        report.to_str().unwrap(),
    ]);
    assert!(stdout.contains("model tiny on sim"), "{stdout}");
    assert!(stdout.contains("over 3/3 workloads"), "{stdout}\n{stderr}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let rows = r["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(r["trials"], 60, "{r}");
    let count = |key: &str| rows.iter().find(|row| row["workload"] == key).unwrap()["count"].as_f64();
    assert_eq!(count("matmul/m64n64k64/tn/f16,f32,f16/alpha=1,beta=0"), Some(12.0));
    assert_eq!(count("matmul/m128n64k64/nn/f16,f32,f16/alpha=1,beta=0"), Some(3.0));
    // The model's time is the sum of count x the faster of ours and the vendor's.
    let mut sum = 0.0;
    for row in rows {
        let (best, vendor, count) =
            (row["best_us"].as_f64().unwrap(), row["vendor_us"].as_f64().unwrap(), row["count"].as_f64().unwrap());
        assert_eq!(row["winner"], if best < vendor { "ours" } else { "vendor" }, "{row}");
        sum += count * best.min(vendor);
    }
    assert!((r["model"]["tuned_us"].as_f64().unwrap() - sum).abs() < 1e-6 * sum, "{r}");
    assert!(r["model"]["tuned_us"].as_f64() <= r["model"]["vendor_us"].as_f64());
    // While it ran, the progress lines showed the model's time.
    assert!(stderr.contains("model ") && stderr.contains("(vendor "), "{stderr}");

    // A workload the job never tuned: export refuses the suite, unless told to leave it out.
    let more = dir.path().join("more.json");
    let text = std::fs::read_to_string(&suite)
        .unwrap()
        .replace("\"count\": 2}", "\"count\": 2},\n{\"workload\": \"matmul/m32n32k32/nn/f16,f32,f16/alpha=1,beta=0\"}");
    std::fs::write(&more, text).unwrap();
    let bundle = dir.path().join("bundle");
    let refused = std::process::Command::new(BIN)
        .args(["--db", db.to_str().unwrap(), "export", "--suite", more.to_str().unwrap()])
        .args(["-o", bundle.to_str().unwrap(), "--no-cubin"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("no trusted ok record for 1 of the 4 workloads"));
    let (_, stderr) = cli(&[
        "export",
        "--suite",
        more.to_str().unwrap(),
        "-o",
        bundle.to_str().unwrap(),
        "--no-cubin",
        "--skip-untuned",
    ]);
    assert!(
        stderr.contains("left out, with no trusted ok record: matmul/m32n32k32/nn/f16,f32,f16/alpha=1,beta=0"),
        "{stderr}"
    );
    let manifest = tensortune_bundle::Bundle::open(&bundle).unwrap().manifest;
    assert_eq!(manifest.kernels.len(), 3);
    for k in &manifest.kernels {
        assert_eq!(k.winner, tensortune_bundle::Entry::winner_of(k.time_us, k.vendor_us), "{}", k.workload_key);
    }
}
