//! Noise-aware winners. A tuning trial is one measurement among many taken over minutes, on
//! whichever worker leased it; the fastest of hundreds is partly the luckiest. So when a workload's
//! tuning ends, its fastest few configs (its finalists) are measured again in one finalist task:
//! one worker, one session, interleaved rounds, so that they share the same conditions. The winner
//! is the fastest re-measurement.
//!
//! The life of a finalist task: created `pending` when the workload's tuning ends (the workload is
//! then `finalizing`), leased like any task, and reported with one measurement per finalist. Its
//! records are flagged `remeasure` and keyed by (task, finalist position). If its lease expires
//! `max_attempts` times, the workload finishes without finalists and the job says so.
//!
//! A job's objective ranks them: the least time, energy or energy x delay per launch. With a max
//! slowdown, the finalists are the fastest trial and the least-energy ones within twice the
//! slowdown of it ([`choose`]), and the winner is the least-energy re-measurement within the
//! slowdown of the fastest re-measured ([`pick`]).

use tensortune_kernels::energy::{self, Objective};

use crate::dispatch::Producer;
use crate::error::{Error, Result};
use crate::model::{Finalist, Measurement, RecordId, Status, TaskState, WorkerId, WorkloadState};
use crate::store::jobs::JobRow;
use crate::store::records::{NewRecord, Remeasure};
use crate::store::tasks::TaskRow;
use crate::store::workloads::WorkloadRow;
use crate::store::{self};
use crate::tracker::{Tracker, Write};

/// How a finalist task's re-measurements rank.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Ranking {
    /// Positions, fastest ok re-measurement first, then those that were not ok in task order.
    pub(crate) order: Vec<usize>,
    /// The position of the winner: the fastest ok re-measurement, if any was ok.
    pub(crate) winner: Option<usize>,
    /// (runner-up - winner) / winner; 0 with fewer than two ok re-measurements.
    pub(crate) gap: f64,
}

/// Ranks re-measurements given as (status, median) in task order. Ties go to the earlier
/// position, which was the faster (or older) tuning record.
pub(crate) fn rank(remeasured: &[(Status, f64)]) -> Ranking {
    let mut ok: Vec<usize> = (0..remeasured.len()).filter(|&i| remeasured[i].0 == Status::Ok).collect();
    ok.sort_by(|&a, &b| remeasured[a].1.total_cmp(&remeasured[b].1).then(a.cmp(&b)));
    let gap = match ok.as_slice() {
        [winner, runner_up, ..] => (remeasured[*runner_up].1 - remeasured[*winner].1) / remeasured[*winner].1,
        _ => 0.0,
    };
    let winner = ok.first().copied();
    let order = ok.into_iter().chain((0..remeasured.len()).filter(|&i| remeasured[i].0 != Status::Ok)).collect();
    Ranking { order, winner, gap }
}

/// Re-measurements given as (status, median time, energy per launch) in task order, ranked for a
/// job's `objective` and max `slowdown` (0: none): by the objective's score, except that with a
/// slowdown the winner is the least-energy ok re-measurement within that fraction of the fastest.
/// A re-measurement the objective cannot score (no energy for an energy objective) ranks with
/// the failures.
pub(crate) fn pick(remeasured: &[(Status, f64, Option<f64>)], objective: Objective, slowdown: f64) -> Ranking {
    let scored: Vec<(Status, f64)> = remeasured
        .iter()
        .map(|&(status, us, energy)| match objective.score(us, energy) {
            Some(score) if status == Status::Ok => (Status::Ok, score),
            _ if status == Status::Ok => (Status::WrongResult, 0.0),
            _ => (status, 0.0),
        })
        .collect();
    let mut ranking = rank(&scored);
    if slowdown > 0.0 {
        let ok: Vec<(f64, Option<f64>, usize)> = (0..remeasured.len())
            .filter(|&i| remeasured[i].0 == Status::Ok)
            .map(|i| (remeasured[i].1, remeasured[i].2, i))
            .collect();
        if let Some(winner) = energy::least_energy_within(&ok, slowdown) {
            ranking.order.retain(|&i| i != winner);
            ranking.order.insert(0, winner);
            ranking.winner = Some(winner);
        }
    }
    ranking
}

/// The finalists among a workload's ok `trials` (median time, energy per launch), as positions:
/// the `n` best by the objective's score; with a max `slowdown`, the fastest and then the
/// least-energy trials within twice the slowdown of it (room for the re-measurement's noise).
pub(crate) fn choose(trials: &[(f64, Option<f64>)], n: usize, objective: Objective, slowdown: f64) -> Vec<usize> {
    let mut by_time: Vec<usize> = (0..trials.len()).filter(|&i| trials[i].0 > 0.0).collect();
    by_time.sort_by(|&a, &b| trials[a].0.total_cmp(&trials[b].0).then(a.cmp(&b)));
    if slowdown > 0.0 {
        let Some(&fastest) = by_time.first() else { return Vec::new() };
        let bound = trials[fastest].0 * (1.0 + 2.0 * slowdown);
        let mut near: Vec<usize> =
            by_time[1..].iter().copied().filter(|&i| trials[i].0 <= bound && trials[i].1.is_some()).collect();
        near.sort_by(|&a, &b| trials[a].1.unwrap_or(f64::INFINITY).total_cmp(&trials[b].1.unwrap_or(f64::INFINITY)));
        return std::iter::once(fastest).chain(near).take(n).collect();
    }
    let mut scored: Vec<(f64, usize)> =
        by_time.into_iter().filter_map(|i| Some((objective.score(trials[i].0, trials[i].1)?, i))).collect();
    scored.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    scored.into_iter().take(n).map(|(_, i)| i).collect()
}

/// One finalist of a workload as a job snapshot shows it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FinalistView {
    pub(crate) finalist: Finalist,
    /// Its re-measurement's record.
    pub(crate) record_id: RecordId,
    /// The re-measured median (as reported; 0 for a re-measurement that was not ok).
    pub(crate) remeasured_us: f64,
}

/// The finalists of each workload in `decided` (those whose re-measurement chose a winner), fastest
/// re-measurement first, from a job's finalist `tasks` and their records: (workload index, list).
pub(crate) fn views(tasks: &[TaskRow], remeasured: &[Remeasure], decided: &[u32]) -> Vec<(u32, Vec<FinalistView>)> {
    let mut out = Vec::new();
    for task in tasks.iter().filter(|t| decided.contains(&t.workload_idx)) {
        let records: Vec<Option<&Remeasure>> = (0..task.finalists.0.len())
            .map(|pos| {
                remeasured.iter().find(|r| r.workload_idx == task.workload_idx && r.finalist_pos as usize == pos)
            })
            .collect();
        let outcomes: Vec<(Status, f64)> =
            records.iter().map(|r| r.map_or((Status::DeviceLost, 0.0), |r| (r.status, r.median_us))).collect();
        let list = rank(&outcomes)
            .order
            .into_iter()
            .filter_map(|pos| {
                let r = records[pos]?;
                Some(FinalistView {
                    finalist: task.finalists.0[pos].clone(),
                    record_id: r.id,
                    remeasured_us: r.median_us,
                })
            })
            .collect();
        out.push((task.workload_idx, list));
    }
    out
}

/// The most ok trials a workload's finalists are chosen from (fastest first): every trial of all
/// but the largest jobs.
pub(crate) const CANDIDATE_TRIALS: u32 = 4096;

/// A finalist re-measured on another worker this many times slower than its tuning record did
/// not reproduce: the record is distrusted. Honest re-measurements differ by a few percent.
const CONFIRM_MARGIN: f64 = 1.5;

impl Tracker {
    /// Called when workload `wl`'s tuning ended in `end`: if the job asks for finalists and the
    /// workload has at least two ok trials, creates its finalist task and makes it `finalizing`
    /// (the caller saves the row). Returns whether it did.
    pub(crate) async fn start_finalists(
        &self,
        w: &mut Write<'_>,
        job: &JobRow,
        wl: &mut WorkloadRow,
        end: WorkloadState,
    ) -> Result<bool> {
        // A cancelled job's late report can end a workload; nothing of it is dispatched any more.
        if job.finalists < 2 || !job.is_active() {
            return Ok(false);
        }
        let all = store::records::fastest_trials(w.conn(), job.id, wl.idx, CANDIDATE_TRIALS).await?;
        let figures: Vec<(f64, Option<f64>)> = all.iter().map(|t| (t.median_us, t.energy_mj)).collect();
        let chosen = choose(&figures, job.finalists as usize, job.objective(), job.max_slowdown);
        let trials: Vec<_> = chosen.into_iter().map(|i| all[i].clone()).collect();
        if trials.len() < 2 {
            tracing::info!(job = job.id, workload = wl.idx, ok = trials.len(), "too few ok trials for finalists");
            return Ok(false);
        }
        let finalists: Vec<Finalist> = trials
            .into_iter()
            .map(|t| Finalist {
                template: t.template,
                template_version: t.template_version,
                config_index: u64::try_from(t.config_index).unwrap_or_default(),
                config: t.config,
                record_id: t.record_id,
                tuned_us: t.median_us,
            })
            .collect();
        let now = w.now();
        let task = store::tasks::insert_finalist(w.conn(), job.id, wl.idx, &finalists, now).await?;
        wl.state = WorkloadState::Finalizing;
        wl.end_state = Some(end);
        w.tasks_ready(1);
        tracing::info!(
            job = job.id,
            workload = wl.idx,
            task,
            finalists = finalists.len(),
            rounds = job.finalist_rounds,
            "workload finalizing: re-measuring its finalists"
        );
        Ok(true)
    }

    /// Stores the re-measurements of finalist task `task` (one record per finalist, in the task's
    /// order; `measurements` has been checked to match) and, when the task was still live and its
    /// workload is finalizing, names the winner and ends the workload. Returns the task's record:
    /// the winner's re-measurement, or the first one when none was ok.
    pub(crate) async fn record_finalists(
        &self,
        w: &mut Write<'_>,
        job: &JobRow,
        task: &TaskRow,
        producer: &Producer<'_>,
        measurements: &[Measurement],
    ) -> Result<RecordId> {
        let finalists = &task.finalists.0;
        if finalists.len() != measurements.len() || finalists.is_empty() {
            return Err(Error::Internal(format!(
                "finalist task {} has {} finalists but {} measurements reached the store",
                task.id,
                finalists.len(),
                measurements.len()
            )));
        }
        let wl = self.workload(w, job, task.workload_idx).await?;
        let now = w.now();
        let mut ids = Vec::with_capacity(finalists.len());
        for (pos, (f, m)) in finalists.iter().zip(measurements).enumerate() {
            let record = NewRecord {
                task_id: task.id,
                job_id: job.id,
                worker_id: producer.worker,
                workload: &wl.workload.0,
                template: &f.template,
                template_version: f.template_version,
                config: &f.config,
                config_index: i64::try_from(f.config_index).unwrap_or(i64::MAX),
                device_class: &job.device_class,
                measurement: m,
                finalist: Some(pos as u32),
                token_id: producer.token,
                untrusted: producer.untrusted(pos),
            };
            ids.push(store::records::insert(w.conn(), &record, now).await?);
            if m.status == Status::Ok && producer.untrusted(pos).is_none() {
                self.confirm(w, f, m.median_us, producer.worker).await?;
            }
        }
        // An untrusted re-measurement ranks with the failures: it may not win.
        let outcomes: Vec<(Status, f64, Option<f64>)> = measurements
            .iter()
            .enumerate()
            .map(|(i, m)| match producer.untrusted(i) {
                Some(_) => (Status::WrongResult, m.median_us, m.power.energy_mj),
                None => (m.status, m.median_us, m.power.energy_mj),
            })
            .collect();
        let ranking = pick(&outcomes, job.objective(), job.max_slowdown);
        let record = ids[ranking.winner.unwrap_or(0)];
        // A task given up on (or of a cancelled job) is stored but decides nothing: its workload
        // already finished without it.
        let live = matches!(task.state, TaskState::Pending | TaskState::Leased);
        store::tasks::complete(w.conn(), task.id, record, None, now).await?;
        if live && wl.state == WorkloadState::Finalizing && job.is_active() {
            self.decide(w, job, wl, &ranking, &ids, finalists).await?;
        }
        Ok(record)
    }

    /// Checks a finalist's tuning record against its re-measurement by `worker`: a time that
    /// another worker cannot come near ([`CONFIRM_MARGIN`]) was not real, and its record becomes
    /// untrusted (workloads it was winning fall back to their fastest trusted record).
    async fn confirm(
        &self,
        w: &mut Write<'_>,
        finalist: &Finalist,
        remeasured_us: f64,
        worker: Option<WorkerId>,
    ) -> Result<()> {
        let tuned_by = store::records::worker_of(w.conn(), finalist.record_id).await?;
        if worker.is_none() || tuned_by.is_none() || tuned_by == worker {
            return Ok(());
        }
        if remeasured_us <= finalist.tuned_us * CONFIRM_MARGIN {
            return Ok(());
        }
        let why = format!(
            "not reproduced: {:.3} us on worker {}, {remeasured_us:.3} us re-measured on worker {}",
            finalist.tuned_us,
            tuned_by.unwrap_or_default(),
            worker.unwrap_or_default()
        );
        tracing::warn!(record = finalist.record_id, %why, "tuning record not confirmed");
        store::records::distrust(w.conn(), finalist.record_id, &why).await?;
        let affected = store::workloads::drop_untrusted_winners(w.settled().await?).await?;
        // After the change (which stored the unsaved rows first): every kept row may be stale.
        w.forget_workloads();
        for (job, _) in affected {
            w.job_changed(job);
        }
        Ok(())
    }

    /// Names the winner of a finalizing workload and gives it its final state.
    async fn decide(
        &self,
        w: &mut Write<'_>,
        job: &JobRow,
        mut wl: WorkloadRow,
        ranking: &Ranking,
        ids: &[RecordId],
        finalists: &[Finalist],
    ) -> Result<()> {
        let now = w.now();
        let tuned_best = wl.best_record_id;
        match ranking.winner {
            Some(pos) => wl.best_record_id = Some(ids[pos]),
            None => {
                let note = format!(
                    "workload {} ({}): no finalist re-measured ok; its best is its fastest tuning record",
                    wl.idx, wl.workload_key
                );
                store::jobs::add_note(w.conn(), job.id, &note, now).await?;
                w.forget_job(job.id);
                tracing::warn!(job = job.id, workload = wl.idx, "no finalist re-measured ok; keeping the tuning best");
            }
        }
        wl.finalist_gap = Some(ranking.gap);
        wl.state = wl.end_state.take().unwrap_or(WorkloadState::Done);
        store::workloads::save_progress(w.settled().await?, &wl).await?;
        // Its best record changed without its best time: the next read goes to the store.
        w.forget_workloads();
        self.touch_job(w, job.id).await?;
        w.job_changed(job.id);
        let winner = ranking.winner.map(|pos| &finalists[pos]);
        tracing::info!(
            job = job.id,
            workload = wl.idx,
            state = wl.state.name(),
            winner = winner.map(|f| f.config_index),
            winner_record = wl.best_record_id,
            gap = ranking.gap,
            // Whether re-measuring changed the verdict of tuning.
            upset = winner.is_some_and(|f| Some(f.record_id) != tuned_best),
            "finalists re-measured; workload finished"
        );
        self.finish_job_if_done(w, job).await
    }

    /// Gives up on finalist task `task`, whose lease expired `max_attempts` times: its workload
    /// finishes without finalists (its best stays the fastest tuning record) and the job says so.
    pub(crate) async fn give_up_finalists(&self, w: &mut Write<'_>, job: &JobRow, task: &TaskRow) -> Result<()> {
        let now = w.now();
        store::tasks::cancel(w.conn(), task.id, now).await?;
        let mut wl = self.workload(w, job, task.workload_idx).await?;
        if wl.state != WorkloadState::Finalizing {
            return Ok(());
        }
        wl.state = wl.end_state.take().unwrap_or(WorkloadState::Done);
        store::workloads::save_progress(w.settled().await?, &wl).await?;
        w.forget_workloads();
        let note = format!(
            "workload {} ({}) finished without finalists: the lease of its finalist task expired {} times; \
             its best is its fastest tuning record",
            wl.idx, wl.workload_key, task.attempts
        );
        store::jobs::add_note(w.conn(), job.id, &note, now).await?;
        w.job_changed(job.id);
        tracing::warn!(
            job = job.id,
            workload = wl.idx,
            task = task.id,
            worker = task.worker_id,
            attempts = task.attempts,
            "finalist task lost its worker too often; workload finished without finalists"
        );
        self.finish_job_if_done(w, job).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fastest_ok_remeasurement_wins() {
        let r = rank(&[(Status::Ok, 10.0), (Status::Ok, 8.0), (Status::WrongResult, 0.0), (Status::Ok, 9.0)]);
        assert_eq!((r.winner, r.order.clone()), (Some(1), vec![1, 3, 0, 2]));
        assert!((r.gap - 0.125).abs() < 1e-12, "{r:?}");
    }

    #[test]
    fn one_or_no_ok_remeasurement() {
        let one = rank(&[(Status::Timeout, 0.0), (Status::Ok, 5.0)]);
        assert_eq!((one.winner, one.order, one.gap), (Some(1), vec![1, 0], 0.0));
        let none = rank(&[(Status::LaunchError, 0.0), (Status::Timeout, 0.0)]);
        assert_eq!((none.winner, none.order, none.gap), (None, vec![0, 1], 0.0));
        // Ties go to the earlier position.
        assert_eq!(rank(&[(Status::Ok, 5.0), (Status::Ok, 5.0)]).winner, Some(0));
    }

    #[test]
    fn the_objective_ranks_remeasurements_and_a_slowdown_picks_least_energy_near_the_fastest() {
        let r = [
            (Status::Ok, 100.0, Some(16.1)),
            (Status::Ok, 102.0, Some(11.1)),
            (Status::Ok, 120.0, Some(9.0)),
            (Status::Ok, 99.0, None),
            (Status::Timeout, 0.0, None),
        ];
        assert_eq!(pick(&r, Objective::Time, 0.0).winner, Some(3));
        // Energy: the one without an energy cannot win; 120 us at 9 mJ does.
        let e = pick(&r, Objective::Energy, 0.0);
        assert_eq!((e.winner, e.order[..3].to_vec()), (Some(2), vec![2, 1, 0]));
        // EDP: 120 x 9 = 1080 beats 102 x 11.1 = 1132 and 100 x 16.1.
        assert_eq!(pick(&r, Objective::Edp, 0.0).winner, Some(2));
        // 3.5% of the fastest (99 us): 100 and 102 qualify, 102 uses least (the fastest has no
        // energy, which does not count as least); at 3%, 102 is out and 100 wins.
        let s = pick(&r, Objective::Time, 0.035);
        assert_eq!((s.winner, s.order[0]), (Some(1), 1));
        assert_eq!(pick(&r, Objective::Time, 0.03).winner, Some(0));
        assert_eq!(pick(&r, Objective::Time, 0.25).winner, Some(2));
    }

    #[test]
    fn finalists_follow_the_objective_or_gather_near_the_fastest() {
        let t = [(100.0, Some(16.0)), (101.0, Some(11.0)), (103.0, Some(12.0)), (150.0, Some(5.0)), (99.0, None)];
        assert_eq!(choose(&t, 3, Objective::Time, 0.0), vec![4, 0, 1]);
        assert_eq!(choose(&t, 3, Objective::Energy, 0.0), vec![3, 1, 2]);
        // 3%: the fastest (99), then the least energy within 6% of it: 101 (11), 103 (12), 100 (16).
        assert_eq!(choose(&t, 3, Objective::Time, 0.03), vec![4, 1, 2]);
        assert!(choose(&[], 3, Objective::Time, 0.03).is_empty());
    }
}
