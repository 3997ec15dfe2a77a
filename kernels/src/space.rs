//! Knob spaces: a template's knobs and their domains, configs as points of the space, and the
//! mixed-radix index that names a config compactly and stably.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

use crate::error::{Error, Result};

/// The value of one knob: an integer (tile sizes, stages) or a name (fragment shape).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum KnobValue {
    /// An integer knob.
    Int(i64),
    /// A named choice.
    Str(String),
}

impl fmt::Display for KnobValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KnobValue::Int(v) => write!(f, "{v}"),
            KnobValue::Str(s) => f.write_str(s),
        }
    }
}

impl From<i64> for KnobValue {
    fn from(v: i64) -> Self {
        KnobValue::Int(v)
    }
}

impl From<&str> for KnobValue {
    fn from(v: &str) -> Self {
        KnobValue::Str(v.to_owned())
    }
}

/// One knob and its domain, in the order the index enumerates it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Knob {
    /// Name used in configs and features, e.g. `block_m`.
    pub name: &'static str,
    /// Allowed values.
    pub values: Vec<KnobValue>,
    /// What a config that leaves the knob out means, for a knob added to a template after configs
    /// of it were written down (scripts, exported bundles, a user's notes): the value that keeps
    /// their kernels as they were. A knob without one must be given.
    pub default: Option<usize>,
}

impl Knob {
    /// An integer knob.
    pub fn ints(name: &'static str, values: &[i64]) -> Knob {
        Knob { name, values: values.iter().map(|v| KnobValue::Int(*v)).collect(), default: None }
    }

    /// A named knob.
    pub fn names(name: &'static str, values: &[&str]) -> Knob {
        Knob { name, values: values.iter().map(|v| KnobValue::from(*v)).collect(), default: None }
    }

    /// The same knob, read as `values[position]` where a config leaves it out.
    pub fn defaulting_to(self, position: usize) -> Knob {
        assert!(position < self.values.len(), "knob {}: default position {position} is outside its domain", self.name);
        Knob { default: Some(position), ..self }
    }

    /// The position in the domain of this knob's value in `config` (its default where the config
    /// leaves it out).
    fn position_in(&self, config: &Config) -> Result<usize> {
        let Some(v) = config.0.get(self.name) else {
            return self.default.ok_or_else(|| Error::invalid("config", format!("knob {:?} is missing", self.name)));
        };
        self.values.iter().position(|x| x == v).ok_or_else(|| {
            let allowed: Vec<String> = self.values.iter().map(|v| v.to_string()).collect();
            Error::invalid("config", format!("{}={v} is not in the domain; allowed: {}", self.name, allowed.join(", ")))
        })
    }
}

/// The cartesian product of a template's knobs. Not every point is valid on every device:
/// the template's `check` says which are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Space {
    /// The knobs, most significant first in the index.
    pub knobs: Vec<Knob>,
}

impl Space {
    /// Points in the product (valid or not).
    pub fn len(&self) -> u64 {
        self.knobs.iter().map(|k| k.values.len() as u64).product()
    }

    /// Whether the space has no points.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The config at `index` (mixed radix, the last knob varying fastest).
    pub fn config(&self, index: u64) -> Result<Config> {
        if index >= self.len() {
            return Err(Error::invalid(
                "config_index",
                format!("{index} is out of range; the space has {} points", self.len()),
            ));
        }
        let mut rest = index;
        let mut values = BTreeMap::new();
        for knob in self.knobs.iter().rev() {
            let radix = knob.values.len() as u64;
            values.insert(knob.name.to_owned(), knob.values[(rest % radix) as usize].clone());
            rest /= radix;
        }
        Ok(Config(values))
    }

    /// The index of `config`; every knob must be present with a value from its domain (a knob
    /// with a default may be left out), and no other.
    pub fn index_of(&self, config: &Config) -> Result<u64> {
        let mut index = 0u64;
        for knob in &self.knobs {
            index = index * knob.values.len() as u64 + knob.position_in(config)? as u64;
        }
        if let Some(extra) = config.0.keys().find(|k| !self.knobs.iter().any(|kn| kn.name == k.as_str())) {
            return Err(Error::invalid("config", format!("unknown knob {extra:?}")));
        }
        Ok(index)
    }

    /// Index of each knob's value in `config`, in knob order (for features and neighbourhoods).
    pub fn positions(&self, config: &Config) -> Result<Vec<usize>> {
        self.knobs.iter().map(|knob| knob.position_in(config)).collect()
    }
}

/// The position in each knob's domain of the point at `index` of a space whose domains have
/// `sizes` (mixed radix, the last knob varying fastest, as [`Space::config`] reads it), without
/// building the config: for templates that walk every index of their space.
pub fn positions_at<const N: usize>(index: u64, sizes: &[usize; N]) -> [usize; N] {
    let mut rest = index;
    let mut positions = [0usize; N];
    for (k, radix) in sizes.iter().enumerate().rev() {
        positions[k] = (rest % *radix as u64) as usize;
        rest /= *radix as u64;
    }
    positions
}

/// One point of a space: knob name -> value, kept sorted so its JSON is canonical.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct Config(pub BTreeMap<String, KnobValue>);

impl Config {
    /// Canonical JSON: keys sorted, no spaces. Equal configs give equal strings.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.0).expect("a map of strings and integers always serialises")
    }

    /// Parses config JSON (any key order).
    pub fn from_json(s: &str) -> Result<Config> {
        serde_json::from_str(s).map(Config).map_err(|e| Error::invalid("config", format!("not a config object: {e}")))
    }

    /// An integer knob.
    pub fn int(&self, name: &'static str) -> Result<i64> {
        match self.0.get(name) {
            Some(KnobValue::Int(v)) => Ok(*v),
            Some(other) => Err(Error::invalid("config", format!("knob {name:?} must be an integer, got {other}"))),
            None => Err(Error::invalid("config", format!("knob {name:?} is missing"))),
        }
    }

    /// A named knob.
    pub fn name(&self, name: &'static str) -> Result<&str> {
        match self.0.get(name) {
            Some(KnobValue::Str(v)) => Ok(v),
            Some(other) => Err(Error::invalid("config", format!("knob {name:?} must be a name, got {other}"))),
            None => Err(Error::invalid("config", format!("knob {name:?} is missing"))),
        }
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&parts.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space() -> Space {
        Space { knobs: vec![Knob::ints("a", &[1, 2, 3]), Knob::names("f", &["x", "y"]), Knob::ints("b", &[16, 32])] }
    }

    #[test]
    fn index_round_trips() {
        let s = space();
        assert_eq!(s.len(), 12);
        for i in 0..s.len() {
            let c = s.config(i).unwrap();
            assert_eq!(s.index_of(&c).unwrap(), i);
            assert_eq!(Config::from_json(&c.to_json()).unwrap(), c);
        }
        assert_eq!(s.config(0).unwrap().to_json(), r#"{"a":1,"b":16,"f":"x"}"#);
        assert!(s.config(12).unwrap_err().to_string().contains("out of range"));
    }

    #[test]
    fn bad_configs_are_named() {
        let s = space();
        let mut c = s.config(3).unwrap();
        c.0.insert("a".into(), KnobValue::Int(7));
        let e = s.index_of(&c).unwrap_err().to_string();
        assert!(e.contains("a=7") && e.contains("allowed: 1, 2, 3"), "{e}");
        c.0.insert("a".into(), KnobValue::Int(1));
        c.0.insert("zzz".into(), KnobValue::Int(1));
        assert!(s.index_of(&c).unwrap_err().to_string().contains("zzz"));
        assert!(Config::from_json("[1]").is_err());
    }
}
