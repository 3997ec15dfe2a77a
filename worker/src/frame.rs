//! Frames on the child's stdin/stdout: a little-endian `u32` byte length, then that many bytes of
//! JSON. The child reads and writes them synchronously (it has one thread); the daemon uses the
//! async half so that a silent child never blocks a runtime worker.

use std::io::{Read, Write};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest frame accepted. A measure request carries two cubins in base64 (well under 16 MiB); a
/// length beyond this means the stream is not speaking the protocol.
pub(crate) const MAX_FRAME: u32 = 256 << 20;

/// Why no message could be read or written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameError {
    /// The other side closed the pipe at a frame boundary (or mid-frame).
    #[error("the pipe was closed")]
    Closed,
    /// Reading or writing failed.
    #[error("pipe i/o failed: {0}")]
    Io(std::io::Error),
    /// The length prefix is implausible: the stream is not frames.
    #[error("a frame of {0} bytes exceeds the limit of {MAX_FRAME} bytes (is something else writing to stdout?)")]
    TooLarge(u32),
    /// The payload is not the expected JSON message.
    #[error("malformed message: {0}")]
    Json(#[from] serde_json::Error),
}

impl From<std::io::Error> for FrameError {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::BrokenPipe => FrameError::Closed,
            _ => FrameError::Io(e),
        }
    }
}

fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let body = serde_json::to_vec(msg)?;
    let len = u32::try_from(body.len()).ok().filter(|&n| n <= MAX_FRAME).ok_or(FrameError::TooLarge(u32::MAX))?;
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

fn checked_len(prefix: [u8; 4]) -> Result<usize, FrameError> {
    let len = u32::from_le_bytes(prefix);
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    Ok(len as usize)
}

/// Writes one frame and flushes.
pub(crate) fn write_sync<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), FrameError> {
    w.write_all(&encode(msg)?)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame.
pub(crate) fn read_sync<T: DeserializeOwned>(r: &mut impl Read) -> Result<T, FrameError> {
    let mut prefix = [0u8; 4];
    r.read_exact(&mut prefix)?;
    let mut body = vec![0u8; checked_len(prefix)?];
    r.read_exact(&mut body)?;
    Ok(serde_json::from_slice(&body)?)
}

/// Writes one frame and flushes.
pub(crate) async fn write_async<T: Serialize>(w: &mut (impl AsyncWrite + Unpin), msg: &T) -> Result<(), FrameError> {
    w.write_all(&encode(msg)?).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one frame.
pub(crate) async fn read_async<T: DeserializeOwned>(r: &mut (impl AsyncRead + Unpin)) -> Result<T, FrameError> {
    let mut prefix = [0u8; 4];
    r.read_exact(&mut prefix).await?;
    let mut body = vec![0u8; checked_len(prefix)?];
    r.read_exact(&mut body).await?;
    Ok(serde_json::from_slice(&body)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Request, Response};

    #[test]
    fn frames_round_trip_and_reject_garbage() {
        let mut buf = Vec::new();
        write_sync(&mut buf, &Request::Hello).unwrap();
        write_sync(&mut buf, &Response::Fatal("no gpu".into())).unwrap();
        assert_eq!(u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize, br#"{"type":"hello"}"#.len());
        let mut r = buf.as_slice();
        assert!(matches!(read_sync::<Request>(&mut r).unwrap(), Request::Hello));
        assert!(matches!(read_sync::<Response>(&mut r).unwrap(), Response::Fatal(t) if t == "no gpu"));
        assert!(matches!(read_sync::<Request>(&mut r), Err(FrameError::Closed)));

        let mut garbage: &[u8] = b"thread 'main' panicked";
        assert!(matches!(read_sync::<Request>(&mut garbage), Err(FrameError::TooLarge(_))));
        let mut bad_json = Vec::from(3u32.to_le_bytes());
        bad_json.extend_from_slice(b"{x}");
        assert!(matches!(read_sync::<Request>(&mut bad_json.as_slice()), Err(FrameError::Json(_))));
    }

    #[tokio::test]
    async fn async_halves_speak_the_same_frames() {
        let mut buf = Vec::new();
        write_async(&mut buf, &Request::Shutdown).await.unwrap();
        let mut r = buf.as_slice();
        assert!(matches!(read_sync::<Request>(&mut r).unwrap(), Request::Shutdown));
        let mut sync_buf = Vec::new();
        write_sync(&mut sync_buf, &Request::Hello).unwrap();
        assert!(matches!(read_async::<Request>(&mut sync_buf.as_slice()).await.unwrap(), Request::Hello));
        assert!(matches!(read_async::<Request>(&mut &b"\x01\x00"[..]).await, Err(FrameError::Closed)));
    }
}
