//! Batched and grouped matmul: the shapes of several problems run by one launch.
//!
//! A **batched** matmul (`batch = B`) is B problems of one shape, each operand's problems one after
//! another in memory (strides M*K, K*N and M*N: `cublasGemmStridedBatchedEx`'s contiguous
//! strides). A **grouped** matmul is G problems with their own M and a shared N and K, the MoE
//! case: A and D are packed along M (D is the column-major M_sum x N matrix whose rows
//! `offset(g) ..` are group g's), so every group's rows of A and D are computed offsets, while B
//! holds G matrices of K x N one after another. [`Groups`] keeps the M of each group; the
//! grouped tile schedule ([`TileSchedule`]) walks every group's tiles in one grid.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

use crate::error::{Error, Result};

/// Most groups one grouped matmul holds: the kernel compiles their table in (and scans it
/// unrolled), and a launch of more is a job for several.
pub const MAX_GROUPS: usize = 64;

/// Most problems of a batched matmul (a grid dimension's worth, far above attention's B * heads).
pub const MAX_BATCH: u64 = 65535;

/// The M of each group of a grouped matmul, in order; empty for any other matmul. The list is
/// interned (one leaked copy per distinct list this process has seen, see [`intern`]), which keeps
/// a matmul small and `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Groups {
    m: &'static [u32],
}

/// The one `'static` copy of `ms`: the distinct group lists a process meets are few (a suite's,
/// a job's), so leaking each once is bounded by them.
fn intern(ms: &[u32]) -> &'static [u32] {
    static SEEN: std::sync::Mutex<std::collections::BTreeSet<&'static [u32]>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&known) = seen.get(ms) {
        return known;
    }
    let leaked: &'static [u32] = Box::leak(ms.to_vec().into_boxed_slice());
    seen.insert(leaked);
    leaked
}

impl Default for Groups {
    fn default() -> Self {
        Groups::NONE
    }
}

impl Groups {
    /// No groups: a plain (or batched) matmul.
    pub const NONE: Groups = Groups { m: &[] };

    /// Groups of these M: 2 ..= [`MAX_GROUPS`] of them, each 1 ..= `max_m`. Errors name `groups`.
    pub fn new(ms: &[u64], max_m: u64) -> Result<Groups> {
        if ms.len() < 2 || ms.len() > MAX_GROUPS {
            return Err(Error::invalid(
                "groups",
                format!(
                    "{} groups; a grouped matmul has 2 ..= {MAX_GROUPS} (one group is a plain matmul m<M>)",
                    ms.len()
                ),
            ));
        }
        if let Some((i, m)) = ms.iter().enumerate().find(|(_, m)| **m == 0 || **m > max_m) {
            return Err(Error::invalid(
                "groups",
                format!("group {i} has m = {m}, out of range; allowed 1 ..= {max_m}"),
            ));
        }
        let m: Vec<u32> = ms.iter().map(|m| *m as u32).collect();
        Ok(Groups { m: intern(&m) })
    }

    /// Whether there are no groups.
    pub fn is_empty(&self) -> bool {
        self.m.is_empty()
    }

    /// How many groups.
    pub fn len(&self) -> usize {
        self.m.len()
    }

    /// Each group's M.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.m.iter().map(|m| *m as u64)
    }

    /// The sum of the groups' M (the packed operands' M).
    pub fn total(&self) -> u64 {
        self.iter().sum()
    }

    /// The first row of each group in the packed A and D.
    pub fn offsets(&self) -> Vec<u64> {
        self.iter()
            .scan(0, |at, m| {
                let first = *at;
                *at += m;
                Some(first)
            })
            .collect()
    }

    /// Whether every group's M (and so every offset) is a multiple of `n`.
    pub fn all_multiple_of(&self, n: u64) -> bool {
        self.iter().all(|m| m.is_multiple_of(n))
    }

    /// The key's spelling of M: `128+256+...`.
    pub fn spelling(&self) -> String {
        self.iter().map(|m| m.to_string()).collect::<Vec<_>>().join("+")
    }

    /// Parses `128+256+...` (the key's M of a grouped matmul).
    pub fn parse(text: &str, max_m: u64) -> Result<Groups> {
        let ms: Vec<u64> = text
            .split('+')
            .map(|p| {
                p.parse::<u64>().map_err(|_| {
                    Error::invalid("groups", format!("{p:?} in m={text:?} is not a number; groups read m<M0>+<M1>+..."))
                })
            })
            .collect::<Result<_>>()?;
        Groups::new(&ms, max_m)
    }
}

impl fmt::Debug for Groups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for Groups {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Groups {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Groups, D::Error> {
        let ms = Vec::<u64>::deserialize(d)?;
        if ms.is_empty() {
            return Ok(Groups::NONE);
        }
        // Each group's bound is the matmul's M bound, which validation checks on their sum.
        Groups::new(&ms, u32::MAX as u64).map_err(serde::de::Error::custom)
    }
}

/// The grouped tile schedule: group g covers `tiles(g) = ceil(M_g / BQ)` tile columns, numbered
/// one group after another; a grid's tile `t` (of `tile_rows` rows per column, walked down the
/// rows first within a group) belongs to the group whose columns hold it. The kernel compiles
/// [`TileSchedule::first_columns`] in and finds a tile's group the same way as [`TileSchedule::locate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileSchedule {
    /// First tile column of each group, then the total.
    first: Vec<u64>,
    /// Tile rows (the view's P = N, in tiles of the cluster).
    rows: u64,
}

/// Where one tile of a grouped grid lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupTile {
    /// The group.
    pub group: usize,
    /// Tile row (along N).
    pub row: u64,
    /// Tile column within the group (along its M).
    pub column: u64,
}

impl TileSchedule {
    /// The schedule of `groups` in tiles of `bq` rows of M and `tile_rows` tile rows along N.
    pub fn new(groups: &Groups, bq: u64, tile_rows: u64) -> TileSchedule {
        let mut first = vec![0];
        for m in groups.iter() {
            first.push(first.last().copied().unwrap_or(0) + m.div_ceil(bq));
        }
        TileSchedule { first, rows: tile_rows }
    }

    /// Tile columns of all groups together.
    pub fn columns(&self) -> u64 {
        self.first.last().copied().unwrap_or(0)
    }

    /// Tiles of the whole grid.
    pub fn tiles(&self) -> u64 {
        self.columns() * self.rows
    }

    /// The first tile column of each group, then the total: the kernel's table.
    pub fn first_columns(&self) -> &[u64] {
        &self.first
    }

    /// The group, row and column of grid tile `t` (< [`TileSchedule::tiles`]): a group's tiles
    /// are `rows * tiles(g)` consecutive ones, walked down the rows first.
    pub fn locate(&self, t: u64) -> GroupTile {
        let column = t / self.rows;
        let group = self.first.partition_point(|&f| f <= column) - 1;
        let local = t - self.first[group] * self.rows;
        GroupTile { group, row: local % self.rows, column: local / self.rows }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_spell_parse_and_name_their_errors() {
        let g = Groups::parse("128+384+4096", 1 << 20).unwrap();
        assert_eq!((g.len(), g.total(), g.spelling()), (3, 4608, "128+384+4096".to_string()));
        assert_eq!(g.offsets(), vec![0, 128, 512]);
        assert!(g.all_multiple_of(128) && !g.all_multiple_of(256));
        let json = serde_json::to_string(&g).unwrap();
        assert_eq!(json, "[128,384,4096]");
        assert_eq!(serde_json::from_str::<Groups>(&json).unwrap(), g);
        for (text, says) in [
            ("128", "1 groups; a grouped matmul has 2 ..= 64"),
            ("128+0", "group 1 has m = 0, out of range; allowed 1 ..= 1048576"),
            ("128+x", "\"x\" in m=\"128+x\" is not a number"),
        ] {
            let e = Groups::parse(text, 1 << 20).unwrap_err();
            assert_eq!(e.field(), Some("groups"), "{e}");
            assert!(e.to_string().contains(says), "{text}: {e}");
        }
        let many = vec![64u64; MAX_GROUPS + 1];
        assert!(Groups::new(&many, 1 << 20).unwrap_err().to_string().contains("65 groups"));
    }

    #[test]
    fn the_tile_schedule_covers_every_tile_of_every_group_once() {
        // Ragged groups: 100 rows is one partial tile, 300 three (the last partial).
        let g = Groups::new(&[100, 128, 300, 1], 1 << 20).unwrap();
        let s = TileSchedule::new(&g, 128, 3);
        assert_eq!(s.first_columns(), &[0, 1, 2, 5, 6]);
        assert_eq!(s.tiles(), 18);
        let mut seen = std::collections::HashSet::new();
        for t in 0..s.tiles() {
            let at = s.locate(t);
            assert!(at.row < 3 && at.column < g.iter().nth(at.group).unwrap().div_ceil(128), "{at:?}");
            assert!(seen.insert((at.group, at.row, at.column)), "{at:?} twice");
        }
        assert_eq!(s.locate(0), GroupTile { group: 0, row: 0, column: 0 });
        assert_eq!(s.locate(7), GroupTile { group: 2, row: 1, column: 0 });
        assert_eq!(s.locate(17), GroupTile { group: 3, row: 2, column: 0 });
    }
}
