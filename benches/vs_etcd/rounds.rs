//! Rounds: the whole run repeated on fresh servers, the systems' order rotated each round, and
//! each system's rounds folded into medians, with the spread kept beside them.
//!
//! One round on this shared machine can be disturbed by whatever else runs; a median of rounds
//! whose systems took turns going first is what the tables report, and the spread (every
//! round's ops/s, and the range as a share of the median) shows how far to trust it.

use std::fmt::Write as _;

use crate::load::SweepPoint;
use crate::report::{Run, SystemResult, WorkloadResult, f};

/// The median of `values` (the mean of the middle two for an even count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// The systems in the order round `round` runs them: rotated by one per round, so each system
/// goes first (and last) as often as the others.
pub fn rotated<T: Clone>(items: &[T], round: usize) -> Vec<T> {
    let mut v = items.to_vec();
    if !v.is_empty() {
        let n = round % v.len();
        v.rotate_left(n);
    }
    v
}

/// One workload's rounds folded into one: the median of every measured number, the errors of
/// all rounds, and the rest (per-operation histograms, server metrics) from the round whose
/// throughput is the median one.
fn fold_workload(rounds: &[&WorkloadResult]) -> WorkloadResult {
    let of = |get: fn(&WorkloadResult) -> f64| {
        median(&rounds.iter().map(|w| get(w)).collect::<Vec<_>>())
    };
    let ops = of(|w| w.ops_per_sec);
    let typical = rounds
        .iter()
        .min_by(|a, b| {
            (a.ops_per_sec - ops)
                .abs()
                .total_cmp(&(b.ops_per_sec - ops).abs())
        })
        .expect("at least one round");
    let db_cpu = rounds
        .iter()
        .all(|w| w.db_cpu_s.is_some())
        .then(|| of(|w| w.db_cpu_s.unwrap_or(0.0)));
    WorkloadResult {
        name: typical.name.clone(),
        latency_of: typical.latency_of.clone(),
        ops: of(|w| w.ops as f64) as u64,
        secs: of(|w| w.secs),
        ops_per_sec: ops,
        p50_ms: of(|w| w.p50_ms),
        p99_ms: of(|w| w.p99_ms),
        p999_ms: of(|w| w.p999_ms),
        max_ms: of(|w| w.max_ms),
        server_cpu_s: of(|w| w.server_cpu_s),
        db_cpu_s: db_cpu,
        client_cpu_s: of(|w| w.client_cpu_s),
        server_context_switches: of(|w| w.server_context_switches as f64) as u64,
        server_disk_write_bytes: of(|w| w.server_disk_write_bytes as f64) as u64,
        other_cpu_s: of(|w| w.other_cpu_s),
        peak_rss_mib: of(|w| w.peak_rss_mib),
        errors: rounds.iter().map(|w| w.errors).sum(),
        error_samples: rounds
            .iter()
            .flat_map(|w| w.error_samples.iter().cloned())
            .take(5)
            .collect(),
        extra: typical.extra.clone(),
    }
}

/// A system's sweeps folded into one: at each offered rate (every round offers the same, in
/// the same order), the median of every measured number and the errors of all rounds. A
/// single stall decides a rate's p99, so one round's sweep says little on a noisy machine.
fn fold_sweep(rounds: &[&SystemResult]) -> Vec<SweepPoint> {
    let Some(first) = rounds.first() else {
        return Vec::new();
    };
    (0..first.sweep.len())
        .map(|i| {
            let same: Vec<&SweepPoint> = rounds.iter().filter_map(|s| s.sweep.get(i)).collect();
            let of = |get: fn(&SweepPoint) -> f64| {
                median(&same.iter().map(|p| get(p)).collect::<Vec<_>>())
            };
            SweepPoint {
                offered: first.sweep[i].offered,
                achieved: of(|p| p.achieved),
                p50_ms: of(|p| p.p50_ms),
                p99_ms: of(|p| p.p99_ms),
                p999_ms: of(|p| p.p999_ms),
                errors: same.iter().map(|p| p.errors).sum(),
                server_cpu_ms_per_op: of(|p| p.server_cpu_ms_per_op),
                other_cpu_s: of(|p| p.other_cpu_s),
            }
        })
        .collect()
}

/// Each system's rounds folded into one result (systems in the order of `rounds[0]`). A system
/// skipped in any round is reported as skipped.
pub fn fold(rounds: &[Vec<SystemResult>]) -> Vec<SystemResult> {
    let Some(first) = rounds.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|system| {
            let mine: Vec<&SystemResult> = rounds
                .iter()
                .filter_map(|r| r.iter().find(|s| s.name == system.name))
                .collect();
            if let Some(skipped) = mine.iter().find(|s| s.skipped.is_some()) {
                return (*skipped).clone();
            }
            let workloads = system
                .workloads
                .iter()
                .map(|w| {
                    let same: Vec<&WorkloadResult> =
                        mine.iter().filter_map(|s| s.workload(&w.name)).collect();
                    fold_workload(&same)
                })
                .collect();
            let rss: Vec<f64> = mine.iter().map(|s| s.peak_rss_mib).collect();
            let disk: Vec<f64> = mine.iter().filter_map(|s| s.disk_mib).collect();
            SystemResult {
                name: system.name.clone(),
                version: system.version.clone(),
                skipped: None,
                workloads,
                sweep: fold_sweep(&mine),
                peak_rss_mib: median(&rss),
                disk_mib: (!disk.is_empty()).then(|| median(&disk)),
                notes: mine.iter().flat_map(|s| s.notes.iter().cloned()).collect(),
            }
        })
        .collect()
}

impl Run {
    /// Every round's throughput per workload and system, the median, the spread, and the
    /// median's ratio to each etcd's median.
    pub fn spread_table(&self) -> String {
        let etcds: Vec<&SystemResult> = self
            .systems
            .iter()
            .filter(|s| {
                s.name.starts_with("etcd") && !s.name.starts_with("etcdsql") && s.skipped.is_none()
            })
            .collect();
        let mut out = String::from("| workload | system | ops/s by round | median | spread |");
        for e in &etcds {
            let _ = write!(out, " ÷ {} |", e.name);
        }
        out.push_str(" p99 ms by round |\n|---|---|---|--:|--:|");
        out.push_str(&"--:|".repeat(etcds.len()));
        out.push_str("---|\n");
        for (system, w, _) in self.rows() {
            let rounds: Vec<&WorkloadResult> = self
                .rounds
                .iter()
                .filter_map(|r| r.iter().find(|s| s.name == system.name)?.workload(&w.name))
                .collect();
            let ops: Vec<f64> = rounds.iter().map(|r| r.ops_per_sec).collect();
            let (lo, hi) = ops
                .iter()
                .fold((f64::MAX, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            let spread = if w.ops_per_sec > 0.0 && !ops.is_empty() {
                format!("±{:.0}%", (hi - lo) / 2.0 / w.ops_per_sec * 100.0)
            } else {
                "–".to_owned()
            };
            let list = |v: Vec<f64>| v.into_iter().map(f).collect::<Vec<_>>().join(" / ");
            let _ = write!(
                out,
                "| {} | {} | {} | {} | {spread} |",
                w.name,
                system.name,
                list(ops.clone()),
                f(w.ops_per_sec)
            );
            for e in &etcds {
                let cell = match e.workload(&w.name) {
                    Some(b) if e.name != system.name && b.ops_per_sec > 0.0 => {
                        format!("{:.2}×", w.ops_per_sec / b.ops_per_sec)
                    }
                    _ => String::new(),
                };
                let _ = write!(out, " {cell} |");
            }
            let _ = writeln!(
                out,
                " {} |",
                list(rounds.iter().map(|r| r.p99_ms).collect())
            );
        }
        out
    }
}
