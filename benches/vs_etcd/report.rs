//! Results: the markdown tables (each system, and etcdsql / etcd from the same run), the issue's
//! targets, the JSON file and the SVG chart of latency against offered load.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::load::SweepPoint;

/// One workload on one system.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadResult {
    pub name: String,
    /// What the latency columns measure: "request", "full list", "delivery".
    pub latency_of: String,
    pub ops: u64,
    pub secs: f64,
    pub ops_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub server_cpu_s: f64,
    /// CPU of the PostgreSQL server processes (etcdsql-postgres only).
    pub db_cpu_s: Option<f64>,
    /// The harness's own CPU: it competes with the server for the same cores.
    pub client_cpu_s: f64,
    /// Context switches of the server's threads during the workload.
    pub server_context_switches: u64,
    /// Bytes the server wrote to storage during the workload (PostgreSQL's excluded).
    pub server_disk_write_bytes: u64,
    /// CPU the rest of the machine used meanwhile (other processes on this shared machine):
    /// large values mean the measurement was disturbed.
    pub other_cpu_s: f64,
    pub peak_rss_mib: f64,
    pub errors: u64,
    pub error_samples: Vec<String>,
    pub extra: Map<String, Value>,
}

impl WorkloadResult {
    /// Server CPU milliseconds per successful operation (PostgreSQL's included).
    pub fn cpu_ms_per_op(&self) -> f64 {
        (self.server_cpu_s + self.db_cpu_s.unwrap_or(0.0)) * 1000.0 / self.ops.max(1) as f64
    }
}

/// Everything measured on one system, or why it was skipped.
#[derive(Clone, Debug, Serialize)]
pub struct SystemResult {
    pub name: String,
    pub version: String,
    pub skipped: Option<String>,
    pub workloads: Vec<WorkloadResult>,
    pub sweep: Vec<SweepPoint>,
    /// Highest peak RSS over all workloads.
    pub peak_rss_mib: f64,
    pub disk_mib: Option<f64>,
    /// Data loading that is not measured (list sets, preloads), for the record.
    pub notes: Vec<String>,
}

impl SystemResult {
    pub fn workload(&self, name: &str) -> Option<&WorkloadResult> {
        self.workloads.iter().find(|w| w.name == name)
    }
}

#[derive(Debug, Serialize)]
pub struct Run {
    pub command: String,
    pub started_unix: u64,
    pub machine: Map<String, Value>,
    pub sizes: crate::load::Sizes,
    /// Each system's rounds folded into medians ([`crate::rounds::fold`]): what the tables show.
    pub systems: Vec<SystemResult>,
    /// Every round as measured, systems in the order of `systems`.
    pub rounds: Vec<Vec<SystemResult>>,
}

pub fn f(x: f64) -> String {
    if x == 0.0 {
        "0".to_owned()
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else if x >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a > 0.0 {
        format!("{:.2}×", a / b)
    } else {
        "–".to_owned()
    }
}

impl SweepPoint {
    /// Whether the system kept up with the offered rate: achieved at least 90% of it.
    fn held(&self) -> bool {
        self.achieved >= 0.9 * self.offered
    }
}

/// The highest offered rate of an open-loop sweep that a system held ([`SweepPoint::held`], the
/// chart's filled markers) with p99 at or under 50 ms; 0 if none.
fn sustained(sweep: &[SweepPoint]) -> f64 {
    sweep
        .iter()
        .filter(|p| p.held() && p.p99_ms <= 50.0)
        .map(|p| p.offered)
        .fold(0.0, f64::max)
}

/// How a target's row reads: met, missed, or `otherwise` when the run cannot tell.
fn verdict(met: Option<bool>, otherwise: &'static str) -> &'static str {
    match met {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => otherwise,
    }
}

impl Run {
    fn etcd(&self) -> Option<&SystemResult> {
        self.systems
            .iter()
            .find(|s| s.name == "etcd" && s.skipped.is_none())
    }

    fn measured(&self) -> impl Iterator<Item = &SystemResult> {
        self.systems.iter().filter(|s| s.skipped.is_none())
    }

    fn workload_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for s in self.measured() {
            for w in &s.workloads {
                if !names.contains(&w.name.as_str()) {
                    names.push(&w.name);
                }
            }
        }
        names
    }

    /// Each workload's row on each system, with etcd's row of the same workload (`None` for
    /// etcd itself).
    pub fn rows(&self) -> Vec<(&SystemResult, &WorkloadResult, Option<&WorkloadResult>)> {
        let etcd = self.etcd();
        let mut rows = Vec::new();
        for name in self.workload_names() {
            for s in self.measured() {
                let Some(w) = s.workload(name) else { continue };
                let base = etcd
                    .filter(|e| e.name != s.name)
                    .and_then(|e| e.workload(name));
                rows.push((s, w, base));
            }
        }
        rows
    }

    /// Throughput and latency: one row per workload and system; etcdsql rows carry their
    /// ratio to etcd from this run.
    pub fn table(&self) -> String {
        let mut out = String::from(
            "| workload | latency of | system | ops/s | p50 ms | p99 ms | p99.9 ms | errors | ops/s ÷ etcd | p99 ÷ etcd |\n\
             |---|---|---|--:|--:|--:|--:|--:|--:|--:|\n",
        );
        for (s, w, base) in self.rows() {
            let (r_ops, r_p99) = match base {
                Some(b) => (
                    ratio(w.ops_per_sec, b.ops_per_sec),
                    ratio(w.p99_ms, b.p99_ms),
                ),
                None => Default::default(),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {r_ops} | {r_p99} |",
                w.name,
                w.latency_of,
                s.name,
                f(w.ops_per_sec),
                f(w.p50_ms),
                f(w.p99_ms),
                f(w.p999_ms),
                w.errors,
            );
        }
        for s in &self.systems {
            if let Some(why) = &s.skipped {
                let _ = writeln!(out, "\n{} was skipped: {why}", s.name);
            }
        }
        out
    }

    /// What each workload cost the server, and how much else was running meanwhile.
    pub fn resources(&self) -> String {
        let mut out = String::from(
            "| workload | system | server CPU s | CPU ms/op | ctx switches/op | disk KiB/op | peak RSS MiB | other CPU s | CPU/op ÷ etcd | RSS ÷ etcd |\n\
             |---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        );
        for (s, w, base) in self.rows() {
            let cpu = match w.db_cpu_s {
                Some(db) => format!("{} + {} pg", f(w.server_cpu_s), f(db)),
                None => f(w.server_cpu_s),
            };
            let (r_cpu, r_rss) = match base {
                Some(b) => (
                    ratio(w.cpu_ms_per_op(), b.cpu_ms_per_op()),
                    ratio(w.peak_rss_mib, b.peak_rss_mib),
                ),
                None => Default::default(),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {cpu} | {} | {} | {} | {} | {} | {r_cpu} | {r_rss} |",
                w.name,
                s.name,
                f(w.cpu_ms_per_op()),
                f(w.server_context_switches as f64 / w.ops.max(1) as f64),
                f(w.server_disk_write_bytes as f64 / 1024.0 / w.ops.max(1) as f64),
                f(w.peak_rss_mib),
                f(w.other_cpu_s),
            );
        }
        out
    }

    /// The open-loop sweep as a table: one row per offered rate and system.
    pub fn sweep_table(&self) -> String {
        let systems: Vec<&SystemResult> = self.measured().filter(|s| !s.sweep.is_empty()).collect();
        if systems.is_empty() {
            return String::new();
        }
        let mut rates: Vec<f64> = systems
            .iter()
            .flat_map(|s| s.sweep.iter().map(|p| p.offered))
            .collect();
        rates.sort_by(f64::total_cmp);
        rates.dedup();
        let mut out = String::from(
            "| offered updates/s | system | achieved/s | p50 ms | p99 ms | p99.9 ms | server CPU ms/op | other CPU s |\n\
             |--:|---|--:|--:|--:|--:|--:|--:|\n",
        );
        for rate in rates {
            for s in &systems {
                let Some(p) = s.sweep.iter().find(|p| p.offered == rate) else {
                    continue;
                };
                let _ = writeln!(
                    out,
                    "| {rate:.0} | {} | {} | {} | {} | {} | {} | {} |",
                    s.name,
                    f(p.achieved),
                    f(p.p50_ms),
                    f(p.p99_ms),
                    f(p.p999_ms),
                    f(p.server_cpu_ms_per_op),
                    f(p.other_cpu_s)
                );
            }
        }
        out
    }

    /// The targets of issue #16 (reads from memory), one row per etcdsql system, with the
    /// measured ratio of medians to etcd's.
    pub fn targets(&self) -> String {
        self.targets_table(|s, etcd, row| {
            let sqlite = s.name.ends_with("sqlite");
            let reads = if sqlite { 2.0 } else { 1.0 };
            let mixed = if sqlite { 1.5 } else { 1.0 };
            let mut row = |target: String, measured: String, met: Option<bool>| {
                row(target, measured, verdict(met, "not measured"));
            };
            let names = s
                .workloads
                .iter()
                .map(|w| w.name.clone())
                .filter(|n| n == "get" || n.starts_with("list-") || n.starts_with("count-"));
            for name in names.collect::<Vec<_>>() {
                let target = format!("{name} ≥ {reads:.1}× etcd ops/s");
                match s.workload(&name).zip(etcd.workload(&name)) {
                    Some((a, b)) => {
                        let t = a.ops_per_sec / b.ops_per_sec;
                        row(target, format!("{t:.2}×"), Some(t >= reads));
                    }
                    None => row(target, "–".into(), None),
                }
            }
            let target = if sqlite {
                format!("mixed ≥ {mixed:.1}× etcd ops/s, p99 ≤ etcd")
            } else {
                format!("mixed ≥ {mixed:.1}× etcd ops/s")
            };
            match s.workload("mixed").zip(etcd.workload("mixed")) {
                Some((a, b)) => {
                    let t = a.ops_per_sec / b.ops_per_sec;
                    let p = a.p99_ms / b.p99_ms;
                    row(
                        target,
                        format!("{t:.2}× ops/s, {p:.2}× p99"),
                        Some(t >= mixed && (!sqlite || p <= 1.0)),
                    );
                }
                None => row(target, "–".into(), None),
            }
        })
    }

    /// The targets of issue #21 (writes), one row per etcdsql system and target, with the
    /// measured ratio of medians to etcd's. Several instances on one database are reported, not
    /// judged: the issue asks for their aggregate and per-instance throughput.
    pub fn write_targets(&self) -> String {
        self.targets_table(|s, etcd, row| {
            let sqlite = s.name.ends_with("sqlite");
            // "etcdsql-postgres-3": three processes share the clients.
            let instances = s
                .name
                .rsplit_once('-')
                .and_then(|(_, n)| n.parse::<u32>().ok())
                .unwrap_or(1);
            let writes = if sqlite { 1.5 } else { 1.0 };
            let mut row = |target: String, measured: String, met: Option<bool>| {
                // Measured, but the run cannot tell: etcd wrote nothing, or both held every rate.
                let met = if instances > 1 {
                    "report only"
                } else {
                    verdict(met, "undecided")
                };
                row(target, measured, met);
            };
            for name in ["create", "update"] {
                let Some((a, b)) = s.workload(name).zip(etcd.workload(name)) else {
                    continue;
                };
                let t = a.ops_per_sec / b.ops_per_sec;
                let p = a.p99_ms / b.p99_ms;
                if instances > 1 {
                    let measured = format!(
                        "{t:.2}×: {} ops/s in all, {} per instance",
                        f(a.ops_per_sec),
                        f(a.ops_per_sec / f64::from(instances))
                    );
                    row(format!("{name}: throughput"), measured, None);
                } else if sqlite {
                    let target = format!("{name} ≥ {writes:.1}× etcd ops/s, p99 ≤ etcd");
                    let measured = format!("{t:.2}× ops/s, {p:.2}× p99");
                    row(target, measured, Some(t >= writes && p <= 1.0));
                } else {
                    let target = format!("{name} ≥ {writes:.1}× etcd ops/s");
                    row(target, format!("{t:.2}×"), Some(t >= writes));
                }
                // PostgreSQL's own writes are not counted: only SQLite's bytes compare.
                if sqlite {
                    let per_op = |w: &WorkloadResult| {
                        w.server_disk_write_bytes as f64 / 1024.0 / w.ops.max(1) as f64
                    };
                    let (ours, theirs) = (per_op(a), per_op(b));
                    let d = ours / theirs;
                    let measured = format!("{} KiB against {} ({d:.2}×)", f(ours), f(theirs));
                    let met = (theirs > 0.0).then_some(d <= 2.0);
                    row(format!("{name}: disk bytes ≤ 2× etcd's"), measured, met);
                }
            }
            if !s.sweep.is_empty() && !etcd.sweep.is_empty() {
                let (ours, theirs) = (sustained(&s.sweep), sustained(&etcd.sweep));
                let highest = etcd.sweep.iter().map(|p| p.offered).fold(0.0, f64::max);
                let target = "sweep: a higher offered rate at p99 ≤ 50 ms than etcd".to_owned();
                if theirs >= highest {
                    // etcd held every rate offered: nothing was found above it, but a lower
                    // one is a miss all the same.
                    let measured =
                        format!("{} against {} (etcd held every rate)", f(ours), f(theirs));
                    row(target, measured, (ours < theirs).then_some(false));
                } else {
                    row(
                        target,
                        format!("{} against {}", f(ours), f(theirs)),
                        Some(ours > theirs),
                    );
                }
            }
        })
    }

    /// One table of an issue's targets: `judge` writes the rows of each etcdsql system, given
    /// etcd's results and a writer of one row (target, measured, verdict).
    fn targets_table(
        &self,
        mut judge: impl FnMut(&SystemResult, &SystemResult, &mut dyn FnMut(String, String, &str)),
    ) -> String {
        let Some(etcd) = self.etcd() else {
            return "etcd did not run: no ratios.\n".to_owned();
        };
        let mut out = String::from("| target | system | measured | met? |\n|---|---|---|---|\n");
        for s in self.measured().filter(|s| s.name.starts_with("etcdsql")) {
            judge(s, etcd, &mut |target, measured, met| {
                let _ = writeln!(out, "| {target} | {} | {measured} | {met} |", s.name);
            });
        }
        out
    }

    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Command: `{}`\n", self.command);
        for (k, v) in &self.machine {
            let _ = writeln!(
                out,
                "- {k}: {}",
                v.as_str().map_or(v.to_string(), str::to_owned)
            );
        }
        for s in &self.systems {
            let _ = write!(out, "- {}: {}", s.name, s.version);
            if let Some(d) = s.disk_mib {
                let _ = write!(out, " (data on disk at the end: {d:.0} MiB)");
            }
            out.push('\n');
        }
        out.push('\n');
        let _ = writeln!(
            out,
            "{} round(s) on fresh servers, the systems' order rotated each round; every number \
             below is the median over the rounds, ratios are of medians.\n",
            self.rounds.len()
        );
        out.push_str(&self.table());
        if self.rounds.len() > 1 {
            out.push_str(
                "\n### Rounds\n\nThroughput of every round, and the spread: half the range \
                 as a share of the median.\n\n",
            );
            out.push_str(&self.spread_table());
        }
        out.push_str(
            "\n### Server resources\n\nCPU ms/op includes PostgreSQL's backends for etcdsql-postgres. \
             *other CPU s*: what the rest of the machine used meanwhile (noise).\n\n",
        );
        out.push_str(&self.resources());
        out.push_str("\n### Targets of issue #16\n\n");
        out.push_str(&self.targets());
        out.push_str("\n### Targets of issue #21\n\n");
        out.push_str(&self.write_targets());
        let sweep = self.sweep_table();
        if !sweep.is_empty() {
            out.push_str("\n### Open-loop update sweep (latency from the due time)\n\n");
            out.push_str(&sweep);
        }
        let mut errors = String::new();
        for s in self.measured() {
            for w in s.workloads.iter().filter(|w| w.errors > 0) {
                let _ = writeln!(
                    errors,
                    "- {} {}: {} errors, e.g. {}",
                    s.name,
                    w.name,
                    w.errors,
                    w.error_samples.join(" | ")
                );
            }
        }
        if !errors.is_empty() {
            out.push_str("\n### Errors\n\n");
            out.push_str(&errors);
        }
        out
    }

    /// Latency against offered load: one colour per system, p99 solid, p50 dashed; log axes.
    /// Hollow markers are rates the system did not sustain (achieved < 90% of offered).
    pub fn svg(&self) -> String {
        let systems: Vec<&SystemResult> = self.measured().filter(|s| !s.sweep.is_empty()).collect();
        let (w, h) = (880.0, 520.0);
        let (left, right, top, bottom) = (80.0, 200.0, 60.0, 60.0);
        let (pw, ph) = (w - left - right, h - top - bottom);
        let points = systems.iter().flat_map(|s| s.sweep.iter());
        let (mut xmin, mut xmax, mut ymin, mut ymax) = (f64::MAX, 0f64, f64::MAX, 0f64);
        for p in points {
            xmin = xmin.min(p.offered);
            xmax = xmax.max(p.offered);
            for y in [p.p50_ms, p.p99_ms] {
                if y > 0.0 {
                    ymin = ymin.min(y);
                    ymax = ymax.max(y);
                }
            }
        }
        if xmax == 0.0 {
            (xmin, xmax, ymin, ymax) = (1.0, 10.0, 0.1, 10.0);
        }
        // A little margin around the offered rates; whole decades of latency.
        let (lx0, lx1) = ((xmin / 1.25).log10(), (xmax * 1.25).log10());
        let (ly0, ly1) = (
            ymin.log10().floor(),
            ymax.log10().ceil().max(ymin.log10().floor() + 1.0),
        );
        let x = |v: f64| left + (v.log10() - lx0) / (lx1 - lx0) * pw;
        let y = |v: f64| top + ph - (v.max(10f64.powf(ly0)).log10() - ly0) / (ly1 - ly0) * ph;
        let colours = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"];
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{left}" y="24" font-size="16">GuaranteedUpdate txn latency vs offered load (open loop)</text>"#
        );
        let machine = self
            .machine
            .get("cpu")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let cores = self
            .machine
            .get("nproc")
            .and_then(Value::as_str)
            .unwrap_or("?");
        let _ = writeln!(
            s,
            r##"<text x="{left}" y="42" fill="#555">{cores} cores, {machine}; p99 solid, p50 dashed; hollow = not sustained</text>"##,
        );
        // Grid and ticks: every 1-2-5 step inside each decade.
        for d in lx0.floor() as i32..=lx1.ceil() as i32 {
            for m in [1.0, 2.0, 5.0] {
                let v = m * 10f64.powi(d);
                if v.log10() > lx1 || v.log10() < lx0 {
                    continue;
                }
                let px = x(v);
                let _ = writeln!(
                    s,
                    r##"<line x1="{px:.1}" y1="{top}" x2="{px:.1}" y2="{:.1}" stroke="#ddd"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                    top + ph,
                    top + ph + 16.0,
                    v
                );
            }
        }
        for d in ly0 as i32..=ly1 as i32 {
            for m in [1.0, 2.0, 5.0] {
                let v = m * 10f64.powi(d);
                if v.log10() > ly1 + 1e-9 {
                    continue;
                }
                let py = y(v);
                let _ = writeln!(
                    s,
                    r##"<line x1="{left}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                    left + pw,
                    left - 6.0,
                    py + 4.0,
                    v
                );
            }
        }
        let _ = writeln!(
            s,
            r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">offered load (update txns / s, log)</text>"#,
            left + pw / 2.0,
            h - 16.0
        );
        let _ = writeln!(
            s,
            r#"<text transform="translate(20 {:.1}) rotate(-90)" text-anchor="middle">latency ms (log)</text>"#,
            top + ph / 2.0
        );
        for (i, sys) in systems.iter().enumerate() {
            let c = colours[i % colours.len()];
            for (field, dash) in [(0, ""), (1, r#" stroke-dasharray="6 4""#)] {
                let pts: Vec<String> = sys
                    .sweep
                    .iter()
                    .map(|p| {
                        let v = if field == 0 { p.p99_ms } else { p.p50_ms };
                        format!("{:.1},{:.1}", x(p.offered), y(v))
                    })
                    .collect();
                let _ = writeln!(
                    s,
                    r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2"{dash}/>"#,
                    pts.join(" ")
                );
                for p in &sys.sweep {
                    let v = if field == 0 { p.p99_ms } else { p.p50_ms };
                    let fill = if p.held() { c } else { "white" };
                    let _ = writeln!(
                        s,
                        r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{fill}" stroke="{c}" stroke-width="2"><title>{}: {:.0}/s offered, {:.0}/s achieved, p50 {:.2} ms, p99 {:.2} ms</title></circle>"#,
                        x(p.offered),
                        y(v),
                        sys.name,
                        p.offered,
                        p.achieved,
                        p.p50_ms,
                        p.p99_ms
                    );
                }
            }
            let ly = top + 20.0 + i as f64 * 22.0;
            let lx = left + pw + 16.0;
            let _ = writeln!(
                s,
                r#"<line x1="{lx}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="{c}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
                lx + 24.0,
                lx + 30.0,
                ly + 4.0,
                sys.name
            );
        }
        s.push_str("</svg>\n");
        s
    }
}
