//! The compile process (`tensortune-worker __compile-child`) speaks the frame protocol: one
//! request, one reply with a cubin; a bad source gets NVRTC's log back and the process lives on.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

fn frame(json: &serde_json::Value) -> Vec<u8> {
    let body = serde_json::to_vec(json).unwrap();
    let mut out = (body.len() as u32).to_le_bytes().to_vec();
    out.extend(body);
    out
}

fn read_frame(r: &mut impl Read) -> serde_json::Value {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    r.read_exact(&mut body).unwrap();
    serde_json::from_slice(&body).unwrap()
}

#[test]
fn compile_process_answers_each_request() {
    assert!(
        tensortune_worker::nvrtc::available(),
        "libnvrtc.so.13 is not loadable: run the tests through scripts/test.sh (it installs NVRTC from PyPI)"
    );
    let include = tensortune_worker::nvrtc::find_include_dir().expect("CUDA headers (scripts/setup-nvrtc.sh)");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tensortune-worker"))
        .arg(tensortune_worker::COMPILE_CHILD_ARG)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let request = |source: &str| {
        frame(&serde_json::json!({"source": source, "name": "k", "arch": "sm_90", "include_dir": include}))
    };
    stdin.write_all(&request("extern \"C\" __global__ void k(float* p) { p[threadIdx.x] = 1.0f; }")).unwrap();
    let ok = read_frame(&mut stdout);
    assert_eq!(ok["type"], "ok", "{ok}");
    assert!(ok["body"]["cubin"].as_str().unwrap().len() > 100);
    stdin.write_all(&request("this is not CUDA")).unwrap();
    let err = read_frame(&mut stdout);
    assert_eq!(err["type"], "err", "{err}");
    assert!(err["body"]["message"].as_str().unwrap().contains("error"), "{err}");
    drop(stdin);
    assert!(child.wait().unwrap().success(), "the process exits cleanly when its input closes");
}
