//! NVRTC in helper processes. In one process NVRTC stops scaling past about four threads (measured
//! on a 16-core H200 host, 2026-11-22: 5.2 compiles/s on one thread, 15.3 on 4, 15.5 on 8, 14.2 on
//! 16; four processes of four threads reached 42/s), so every thread of the compile pool drives its
//! own single-threaded compile process. A crash inside NVRTC then takes down only that process.
//!
//! Frames are those of the measuring child (`frame.rs`): a request per compile, a reply each.

use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::frame::{self, FrameError};
use crate::nvrtc;

/// The argument that makes a worker binary act as a compile process (see [`compile_child_main`]).
pub const COMPILE_CHILD_ARG: &str = "__compile-child";

/// Compile one source.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CompileRequest {
    pub(crate) source: String,
    pub(crate) name: String,
    pub(crate) arch: String,
    pub(crate) include_dir: PathBuf,
}

/// What NVRTC said.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", content = "body", rename_all = "snake_case")]
pub(crate) enum CompileReply {
    /// A cubin.
    Ok {
        #[serde(with = "crate::protocol::b64")]
        cubin: Vec<u8>,
        ms: f64,
    },
    /// The compiler's full error.
    Err { message: String, ms: f64 },
}

/// The compile process's loop: one request at a time on stdin, one reply each on stdout, until
/// stdin closes.
pub fn compile_child_main() -> anyhow::Result<()> {
    let mut input = BufReader::new(std::io::stdin().lock());
    let mut output = BufWriter::new(std::io::stdout().lock());
    loop {
        let request: CompileRequest = match frame::read_sync(&mut input) {
            Ok(r) => r,
            Err(FrameError::Closed) => return Ok(()),
            Err(e) => return Err(anyhow::anyhow!("compile process: {e}")),
        };
        let start = std::time::Instant::now();
        let reply = match nvrtc::compile(&request.source, &request.name, &request.arch, &request.include_dir) {
            Ok(c) => CompileReply::Ok { cubin: c.cubin, ms: c.ms },
            Err(e) => CompileReply::Err { message: e.to_string(), ms: start.elapsed().as_secs_f64() * 1e3 },
        };
        frame::write_sync(&mut output, &reply)?;
    }
}

/// A running compile process, owned by one compile thread.
pub(crate) struct CompileProcess {
    child: Child,
    stdin: BufWriter<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl CompileProcess {
    /// Starts `program __compile-child`.
    pub(crate) fn spawn(program: &str) -> std::io::Result<CompileProcess> {
        let mut child = Command::new(program)
            .arg(COMPILE_CHILD_ARG)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = BufWriter::new(child.stdin.take().expect("piped stdin"));
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Ok(CompileProcess { child, stdin, stdout })
    }

    /// Compiles through the process; an error means the process is gone (the caller drops it).
    pub(crate) fn compile(&mut self, request: &CompileRequest) -> Result<CompileReply, FrameError> {
        frame::write_sync(&mut self.stdin, request)?;
        frame::read_sync(&mut self.stdout)
    }
}

impl Drop for CompileProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
