//! One line of a record file: what `tensortune records export` writes, and what the shipped record
//! packs and the GPU sweeps hold (JSON lines, one record each). Both the replay here and the
//! tracker's packs read them through [`RecordLine::parse`]; the config is read into a [`Config`]
//! straight away (no intermediate JSON value), as this crate is built optimised in test builds.

use serde::Deserialize;
use tensortune_kernels::Config;

/// The fields of a record line that replay and the packs read.
#[derive(Debug, Deserialize)]
pub struct RecordLine {
    /// Workload key.
    pub workload: String,
    /// Template name.
    pub template: String,
    /// Template version.
    pub template_version: u32,
    /// The config (knob name -> value).
    #[serde(deserialize_with = "config_field")]
    pub config: Config,
    /// Device class (`nvidia-h200/sm90/132sm`).
    pub device_class: String,
    /// Record status (`ok`, `wrong_result`, ...).
    pub status: String,
    /// Median time in microseconds (an `ok` record's; absent or 0 for the others).
    #[serde(default)]
    pub median_us: Option<f64>,
}

/// A config, with serde's message prefixed by the field's name (serde names a nested value's
/// position only, not the field that holds it).
fn config_field<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Config, D::Error> {
    Config::deserialize(d).map_err(|e| serde::de::Error::custom(format!("config: {e}")))
}

impl RecordLine {
    /// Parses one line (serde's message names the field that is wrong).
    pub fn parse(line: &str) -> Result<RecordLine, serde_json::Error> {
        serde_json::from_str(line)
    }

    /// The time of an `ok` record with a positive time; `None` for every other record.
    pub fn ok_time(&self) -> Option<f64> {
        self.median_us.filter(|t| self.status == "ok" && *t > 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_reads_its_config_and_an_absent_time() {
        let l = RecordLine::parse(
            r#"{"workload":"w","template":"wmma_gemm","template_version":6,"config":{"b":2,"a":"x"},"device_class":"c","status":"timeout"}"#,
        )
        .unwrap();
        assert_eq!(l.config.to_json(), r#"{"a":"x","b":2}"#);
        assert_eq!((l.median_us, l.ok_time()), (None, None));
        let err = RecordLine::parse(r#"{"workload":"w","template":"t","template_version":-1}"#).unwrap_err();
        assert!(err.to_string().contains("invalid value"), "{err}");
        let err =
            RecordLine::parse(r#"{"workload":"w","template":"t","template_version":1,"config":"x"}"#).unwrap_err();
        assert!(err.to_string().contains("config: invalid type"), "{err}");
    }
}
