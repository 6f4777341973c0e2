//! The workloads: Kubernetes-shaped requests through the etcd v3 gRPC API.
//!
//! Requests are the ones kube-apiserver sends (see SPEC.md §2–§5): the create txn
//! (`MOD(k) == 0 → Put`), GuaranteedUpdate (`MOD(k) == R → Put | Range`), single-key linearizable
//! Range, paginated lists pinned to the first page's revision and continued from
//! `last key + "\0"`, `count_only`, prefix watches, and leases granted for event keys.
//!
//! Every workload stops by itself: after a fixed number of operations or a fixed time, and
//! never later than `max_secs`. Latency is measured per request on the client, from just before
//! the request is sent to the reply (closed loop), or from the moment the request was *due* in
//! the open-loop sweep, so that a server that falls behind is charged for the wait
//! (no coordinated omission).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KvClient, PutOptions, Txn, TxnOp,
    TxnOpResponse, TxnResponse, WatchOptions,
};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Latencies in microseconds, 1 µs to 10 minutes, three significant digits.
pub type Hist = Histogram<u64>;

pub fn new_hist() -> Hist {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

fn record(h: &mut Hist, d: Duration) {
    h.saturating_record((d.as_micros() as u64).max(1));
}

fn ms(h: &Hist, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1000.0
    }
}

/// p50 / p99 / p99.9 / max of a histogram, in milliseconds, for the JSON report.
pub fn summary(h: &Hist) -> Value {
    json!({
        "count": h.len(),
        "p50_ms": ms(h, 0.5),
        "p99_ms": ms(h, 0.99),
        "p999_ms": ms(h, 0.999),
        "max_ms": if h.is_empty() { 0.0 } else { h.max() as f64 / 1000.0 },
    })
}

/// How big each workload is. `full()` is the default run, `smoke()` the CI run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Sizes {
    /// Concurrent client tasks of the closed-loop workloads.
    pub clients: usize,
    /// gRPC connections (HTTP/2) the clients share.
    pub conns: usize,
    /// Namespaces the configmaps of `create` spread over.
    pub namespaces: usize,
    pub value_size: usize,
    pub creates: u64,
    pub updates: u64,
    /// Share of updates sent with a stale revision, in percent.
    pub stale_percent: u32,
    pub gets: u64,
    /// Keys under each list prefix.
    pub list_sizes: Vec<u64>,
    pub list_page: i64,
    /// Full paginated lists per prefix.
    pub list_repeats: u64,
    /// `count_only` requests per prefix.
    pub counts: u64,
    pub watchers: Vec<usize>,
    /// Creates per second while the watchers listen.
    pub watch_rate: f64,
    pub watch_secs: f64,
    pub mixed_secs: f64,
    /// Offered loads of the open-loop update sweep, in requests per second.
    pub sweep_rates: Vec<f64>,
    pub sweep_secs: f64,
    /// No workload runs longer than this.
    pub max_secs: f64,
    pub rounds: usize,
}

impl Sizes {
    pub fn full() -> Sizes {
        Sizes {
            clients: 64,
            conns: 8,
            namespaces: 100,
            value_size: 1024,
            // Each workload: 100,000 operations or 20 s, whichever comes first.
            creates: 100_000,
            updates: 100_000,
            stale_percent: 5,
            gets: 100_000,
            list_sizes: vec![10_000, 100_000],
            list_page: 500,
            list_repeats: 100_000,
            counts: 100_000,
            watchers: vec![1, 100, 1000],
            watch_rate: 500.0,
            watch_secs: 20.0,
            mixed_secs: 20.0,
            sweep_rates: vec![250.0, 500.0, 1000.0, 2000.0, 4000.0, 8000.0],
            sweep_secs: 2.0,
            max_secs: 20.0,
            rounds: 3,
        }
    }

    pub fn smoke() -> Sizes {
        Sizes {
            clients: 8,
            conns: 2,
            namespaces: 10,
            value_size: 1024,
            creates: 300,
            updates: 300,
            stale_percent: 5,
            gets: 300,
            list_sizes: vec![1200],
            list_page: 500,
            list_repeats: 1,
            counts: 3,
            watchers: vec![1, 20],
            watch_rate: 100.0,
            watch_secs: 1.0,
            mixed_secs: 2.0,
            sweep_rates: vec![100.0, 200.0],
            sweep_secs: 1.0,
            max_secs: 30.0,
            rounds: 1,
        }
    }
}

/// Errors of one workload: a count and the first few distinct messages.
#[derive(Default)]
pub struct Errors {
    count: AtomicU64,
    samples: Mutex<Vec<String>>,
}

impl Errors {
    pub fn add(&self, e: impl ToString) {
        self.count.fetch_add(1, Relaxed);
        let e = e.to_string();
        let mut samples = self.samples.lock().unwrap();
        if samples.len() < 5 && !samples.contains(&e) {
            samples.push(e);
        }
    }

    /// Adds another workload part's errors to these.
    fn absorb(&self, other: &Errors) {
        let (n, samples) = other.take();
        for s in &samples {
            self.add(s);
        }
        self.count
            .fetch_add(n.saturating_sub(samples.len() as u64), Relaxed);
    }

    fn take(&self) -> (u64, Vec<String>) {
        (
            self.count.load(Relaxed),
            std::mem::take(&mut *self.samples.lock().unwrap()),
        )
    }
}

/// What one workload measured on the client side.
pub struct Measured {
    /// Operations that succeeded.
    pub ops: u64,
    pub elapsed: Duration,
    /// The latency the report's table shows for this workload.
    pub latency: Hist,
    pub errors: u64,
    pub error_samples: Vec<String>,
    /// Workload-specific numbers for the JSON report.
    pub extra: Map<String, Value>,
}

/// One point of the open-loop sweep.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SweepPoint {
    pub offered: f64,
    pub achieved: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub errors: u64,
    /// Server CPU milliseconds per request at this load (PostgreSQL's backends included).
    pub server_cpu_ms_per_op: f64,
    /// CPU seconds the rest of the machine used meanwhile (noise).
    pub other_cpu_s: f64,
}

/// The client side of one system's run: connections, sizes, and the keys written so far.
pub struct Ctx {
    clients: Vec<Client>,
    pub sizes: Sizes,
    value: Arc<Vec<u8>>,
    /// Every configmap created so far with the mod revision the harness last saw for it.
    configmaps: Vec<Known>,
    loaded_lists: Vec<u64>,
}

impl Ctx {
    /// Connects to a server's instances, the connections spread over them in turn.
    pub async fn connect(endpoints: &[String], sizes: Sizes) -> Result<Ctx, String> {
        let mut clients = Vec::new();
        // Every instance gets at least one connection.
        for i in 0..sizes.conns.max(endpoints.len()) {
            let endpoint = &endpoints[i % endpoints.len()];
            // A request that takes longer than this counts as an error instead of hanging.
            let options = ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(5))
                .with_timeout(Duration::from_secs(60));
            let client = Client::connect([endpoint], Some(options))
                .await
                .map_err(|e| format!("connect {endpoint}: {e}"))?;
            clients.push(client);
        }
        // Incompressible-looking bytes, so no layer gets an unfair advantage from compression.
        let mut rng = StdRng::seed_from_u64(6);
        let value = (0..sizes.value_size)
            .map(|_| rng.random_range(b'a'..=b'z'))
            .collect();
        Ok(Ctx {
            clients,
            sizes,
            value: Arc::new(value),
            configmaps: Vec::new(),
            loaded_lists: Vec::new(),
        })
    }

    fn kv(&self, i: usize) -> KvClient {
        self.clients[i % self.clients.len()].kv_client()
    }

    fn cap(&self) -> Duration {
        Duration::from_secs_f64(self.sizes.max_secs)
    }
}

/// A key and the mod revision the harness last saw for it.
type Known = (Vec<u8>, i64);

fn configmap_key(namespace: u64, i: u64) -> Vec<u8> {
    format!("/registry/configmaps/ns-{namespace}/cm-{i:07}").into_bytes()
}

/// kube-apiserver's create: the key must not exist (`MOD == 0`).
fn create_txn(key: Vec<u8>, value: Vec<u8>, lease: i64) -> Txn {
    let options = (lease != 0).then(|| PutOptions::new().with_lease(lease));
    Txn::new()
        .when([Compare::mod_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key, value, options)])
}

fn revision(resp: &TxnResponse) -> i64 {
    resp.header().map_or(0, |h| h.revision())
}

/// kube-apiserver's GuaranteedUpdate: put if the key is still at `expected`, else read it.
/// Returns the key's new mod revision and whether the failure branch ran.
async fn guaranteed_update(
    kv: &mut KvClient,
    key: &[u8],
    expected: i64,
    value: Vec<u8>,
) -> Result<(i64, bool), String> {
    let txn = Txn::new()
        .when([Compare::mod_revision(
            key.to_vec(),
            CompareOp::Equal,
            expected,
        )])
        .and_then([TxnOp::put(key.to_vec(), value, None)])
        .or_else([TxnOp::get(key.to_vec(), None)]);
    let resp = kv.txn(txn).await.map_err(|e| format!("update: {e}"))?;
    if resp.succeeded() {
        return Ok((revision(&resp), false));
    }
    let current = resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.mod_revision()),
        _ => None,
    });
    current
        .map(|rev| (rev, true))
        .ok_or_else(|| "update: failure branch without the key".to_owned())
}

/// Waits until `due`, or not at all if it has passed: tokio's timer has millisecond ticks, so
/// even an already-due sleep may wait for the next tick, which would cap an open-loop
/// generator at about one request per tick.
async fn pace_until(due: Instant) {
    if due > Instant::now() {
        tokio::time::sleep_until(due.into()).await;
    }
}

/// The result of [`closed_loop`]: every worker's state back, and what it measured.
struct Loop<S> {
    states: Vec<S>,
    /// One histogram per kind of operation.
    by_kind: Vec<Hist>,
    ops: u64,
    elapsed: Duration,
    errors: Arc<Errors>,
}

impl<S> Loop<S> {
    fn all(&self) -> Hist {
        let mut all = new_hist();
        for h in &self.by_kind {
            all.add(h).expect("same bounds");
        }
        all
    }
}

/// Runs `op` on one task per worker state until `total` operations were handed out or `cap`
/// passed. `op` returns the kind of operation it ran (an index below `kinds`) for per-kind
/// latencies. With `pace`, operation `i` is not started before `start + i / pace`.
async fn closed_loop<S, F, Fut>(
    states: Vec<S>,
    total: u64,
    cap: Duration,
    kinds: usize,
    pace: Option<f64>,
    op: F,
) -> Loop<S>
where
    S: Send + 'static,
    F: Fn(S, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = (S, Result<usize, String>)> + Send + 'static,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Errors::default());
    let start = Instant::now();
    let deadline = start + cap;
    let mut tasks = Vec::new();
    for mut state in states {
        let (op, next, errors) = (op.clone(), next.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut hists: Vec<Hist> = (0..kinds).map(|_| new_hist()).collect();
            let mut done = 0u64;
            loop {
                let i = next.fetch_add(1, Relaxed);
                if i >= total || Instant::now() >= deadline {
                    break;
                }
                if let Some(rate) = pace {
                    pace_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
                }
                let t = Instant::now();
                let (s, outcome) = op(state, i).await;
                state = s;
                match outcome {
                    Ok(kind) => {
                        record(&mut hists[kind], t.elapsed());
                        done += 1;
                    }
                    Err(e) => errors.add(e),
                }
            }
            (state, hists, done)
        }));
    }
    let mut out = Loop {
        states: Vec::new(),
        by_kind: (0..kinds).map(|_| new_hist()).collect(),
        ops: 0,
        elapsed: Duration::ZERO,
        errors,
    };
    for task in tasks {
        let (state, hists, done) = task.await.expect("a worker panicked");
        out.states.push(state);
        for (all, h) in out.by_kind.iter_mut().zip(&hists) {
            all.add(h).expect("same bounds");
        }
        out.ops += done;
    }
    out.elapsed = start.elapsed();
    out
}

fn measured<S>(l: &Loop<S>, latency: Hist, extra: Map<String, Value>) -> Measured {
    let (errors, error_samples) = l.errors.take();
    Measured {
        ops: l.ops,
        elapsed: l.elapsed,
        latency,
        errors,
        error_samples,
        extra,
    }
}

/// `create`: `clients` workers create `/registry/configmaps/ns-<i>/cm-<j>` with the create txn.
pub async fn create(ctx: &mut Ctx) -> Measured {
    let base = ctx.configmaps.len() as u64;
    let namespaces = ctx.sizes.namespaces as u64;
    let states: Vec<(KvClient, Vec<Known>)> = (0..ctx.sizes.clients)
        .map(|w| (ctx.kv(w), Vec::new()))
        .collect();
    let value = ctx.value.clone();
    let l = closed_loop(
        states,
        ctx.sizes.creates,
        ctx.cap(),
        1,
        None,
        move |(mut kv, mut made), i| {
            let value = value.clone();
            async move {
                let n = base + i;
                let key = configmap_key(n % namespaces, n);
                let outcome = match kv.txn(create_txn(key.clone(), value.to_vec(), 0)).await {
                    Ok(resp) if resp.succeeded() => {
                        made.push((key, revision(&resp)));
                        Ok(0)
                    }
                    Ok(_) => Err("create: the key already exists".to_owned()),
                    Err(e) => Err(format!("create: {e}")),
                };
                ((kv, made), outcome)
            }
        },
    )
    .await;
    let m = measured(&l, l.all(), Map::new());
    for (_, made) in l.states {
        ctx.configmaps.extend(made);
    }
    m
}

/// Makes sure `creates` configmaps exist (when `create` did not run), with batched puts.
pub async fn ensure_configmaps(ctx: &mut Ctx) -> Result<(), String> {
    let want = ctx.sizes.creates.max(ctx.sizes.clients as u64);
    let have = ctx.configmaps.len() as u64;
    if have >= want {
        return Ok(());
    }
    let namespaces = ctx.sizes.namespaces as u64;
    let keys: Vec<Vec<u8>> = (have..want)
        .map(|n| configmap_key(n % namespaces, n))
        .collect();
    for chunk in keys.chunks(100) {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|k| TxnOp::put(k.clone(), ctx.value.to_vec(), None))
            .collect();
        let resp = ctx
            .kv(0)
            .txn(Txn::new().and_then(ops))
            .await
            .map_err(|e| format!("preload configmaps: {e}"))?;
        let rev = revision(&resp);
        ctx.configmaps
            .extend(chunk.iter().map(|k| (k.clone(), rev)));
    }
    Ok(())
}

/// Worker `w` of `workers` owns every configmap whose index is `w` modulo `workers`, so
/// updates never conflict with each other: a failure branch is always a planned stale one.
fn partition(keys: &[Known], workers: usize) -> Vec<Vec<Known>> {
    let mut parts = vec![Vec::new(); workers];
    for (i, k) in keys.iter().enumerate() {
        parts[i % workers].push(k.clone());
    }
    parts
}

/// Per-worker state of the update-shaped workloads.
struct Updater {
    kv: KvClient,
    keys: Vec<Known>,
    next: usize,
    rng: StdRng,
}

impl Updater {
    /// One GuaranteedUpdate on the next owned key; `stale_percent` of them with a stale
    /// revision. Returns the new revision and whether the (planned) failure branch ran.
    async fn update(&mut self, stale_percent: u32, value: Vec<u8>) -> Result<(i64, bool), String> {
        let slot = self.next % self.keys.len();
        self.next += 1;
        let stale = self.rng.random_range(0..100) < stale_percent;
        let (key, known) = &self.keys[slot];
        let expected = if stale { known - 1 } else { *known };
        let (now, failed) = guaranteed_update(&mut self.kv, key, expected, value).await?;
        self.keys[slot].1 = now;
        match (stale, failed) {
            (true, true) | (false, false) => Ok((now, failed)),
            (false, true) => Err("update: conflict on a key no one else writes".to_owned()),
            (true, false) => Err("update: a stale revision was accepted".to_owned()),
        }
    }
}

fn updaters(ctx: &Ctx, seed: u64) -> Vec<Updater> {
    let workers = ctx.sizes.clients.min(ctx.configmaps.len()).max(1);
    partition(&ctx.configmaps, workers)
        .into_iter()
        .enumerate()
        .map(|(w, keys)| Updater {
            kv: ctx.kv(w),
            keys,
            next: 0,
            rng: StdRng::seed_from_u64(seed + w as u64),
        })
        .collect()
}

fn give_back(ctx: &mut Ctx, states: impl IntoIterator<Item = Updater>) {
    ctx.configmaps = states.into_iter().flat_map(|u| u.keys).collect();
}

/// `update`: GuaranteedUpdate txns on existing configmaps, `stale_percent` of them stale.
pub async fn update(ctx: &mut Ctx) -> Result<Measured, String> {
    ensure_configmaps(ctx).await?;
    let stale_percent = ctx.sizes.stale_percent;
    let value = ctx.value.clone();
    let l = closed_loop(
        updaters(ctx, 100),
        ctx.sizes.updates,
        ctx.cap(),
        2,
        None,
        move |mut u: Updater, _| {
            let value = value.clone();
            async move {
                let outcome = u
                    .update(stale_percent, value.to_vec())
                    .await
                    .map(|(_, failed)| usize::from(failed));
                (u, outcome)
            }
        },
    )
    .await;
    let mut extra = Map::new();
    extra.insert("success_branch".into(), summary(&l.by_kind[0]));
    extra.insert("failure_branch".into(), summary(&l.by_kind[1]));
    let m = measured(&l, l.all(), extra);
    give_back(ctx, l.states);
    Ok(m)
}

/// `get`: single-key linearizable Range of random existing configmaps.
pub async fn get(ctx: &mut Ctx) -> Result<Measured, String> {
    ensure_configmaps(ctx).await?;
    let keys: Arc<Vec<Vec<u8>>> = Arc::new(ctx.configmaps.iter().map(|(k, _)| k.clone()).collect());
    let states: Vec<(KvClient, StdRng)> = (0..ctx.sizes.clients)
        .map(|w| (ctx.kv(w), StdRng::seed_from_u64(200 + w as u64)))
        .collect();
    let l = closed_loop(
        states,
        ctx.sizes.gets,
        ctx.cap(),
        1,
        None,
        move |(mut kv, mut rng), _| {
            let keys = keys.clone();
            async move {
                let key = keys[rng.random_range(0..keys.len())].clone();
                let outcome = match kv.get(key, None).await {
                    Ok(resp) if resp.kvs().len() == 1 => Ok(0),
                    Ok(_) => Err("get: an existing key was not found".to_owned()),
                    Err(e) => Err(format!("get: {e}")),
                };
                ((kv, rng), outcome)
            }
        },
    )
    .await;
    Ok(measured(&l, l.all(), Map::new()))
}

/// "10k" for 10000: how prefixes and workloads are named.
pub fn short(n: u64) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// A custom resource's prefix, as kube-apiserver lays them out: `/registry/<group>/<resource>/`.
fn list_prefix(size: u64) -> String {
    format!("/registry/bench.etcdsql.io/items{}/", short(size))
}

fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    end
}

/// Writes `size` keys under the list prefix for `size` (once per run), 100 puts per txn from
/// several connections. Not measured.
pub async fn load_list_set(ctx: &mut Ctx, size: u64) -> Result<Duration, String> {
    let start = Instant::now();
    if ctx.loaded_lists.contains(&size) {
        return Ok(Duration::ZERO);
    }
    let prefix = list_prefix(size);
    let batches: Vec<u64> = (0..size.div_ceil(100)).collect();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks: Vec<tokio::task::JoinHandle<Result<(), String>>> = Vec::new();
    for w in 0..ctx.sizes.conns.max(1) * 2 {
        let (mut kv, next, prefix, value) =
            (ctx.kv(w), next.clone(), prefix.clone(), ctx.value.clone());
        let batches = batches.len() as u64;
        tasks.push(tokio::spawn(async move {
            loop {
                let b = next.fetch_add(1, Relaxed);
                if b >= batches {
                    return Ok(());
                }
                let ops: Vec<TxnOp> = (b * 100..((b + 1) * 100).min(size))
                    .map(|j| {
                        let key = format!("{prefix}ns-{:02}/item-{j:07}", j % 100);
                        TxnOp::put(key, value.to_vec(), None)
                    })
                    .collect();
                kv.txn(Txn::new().and_then(ops))
                    .await
                    .map_err(|e| format!("load {prefix}: {e}"))?;
            }
        }));
    }
    for t in tasks {
        t.await.expect("a loader panicked")?;
    }
    ctx.loaded_lists.push(size);
    Ok(start.elapsed())
}

/// `list`: full paginated lists of the prefix holding `size` keys, one after another, as
/// kube-apiserver pages them (limit `list_page`, revision pinned by the first page, continue
/// from the last key + `"\0"`). The latency is a whole list's.
pub async fn list(ctx: &Ctx, size: u64) -> Measured {
    let prefix = list_prefix(size);
    let end = prefix_end(&prefix);
    let page = ctx.sizes.list_page;
    let mut kv = ctx.kv(0);
    let errors = Errors::default();
    let (mut lists, mut pages) = (new_hist(), new_hist());
    let mut done = 0;
    let start = Instant::now();
    let mut longest = Duration::ZERO;
    for _ in 0..ctx.sizes.list_repeats {
        // Start another list only if it can finish before the cap, judging by the slowest yet.
        if start.elapsed() + longest > ctx.cap() {
            break;
        }
        let t = Instant::now();
        let mut seen = 0u64;
        let mut key = prefix.as_bytes().to_vec();
        let mut pinned = 0;
        let result: Result<(), String> = async {
            loop {
                let mut options = GetOptions::new().with_range(end.clone()).with_limit(page);
                if pinned != 0 {
                    options = options.with_revision(pinned);
                }
                let p = Instant::now();
                let resp = kv
                    .get(key.clone(), Some(options))
                    .await
                    .map_err(|e| format!("list page: {e}"))?;
                record(&mut pages, p.elapsed());
                if pinned == 0 {
                    pinned = resp.header().map_or(0, |h| h.revision());
                }
                seen += resp.kvs().len() as u64;
                match resp.kvs().last() {
                    Some(last) if resp.more() => {
                        key = last.key().to_vec();
                        key.push(0);
                    }
                    _ => return Ok(()),
                }
            }
        }
        .await;
        longest = longest.max(t.elapsed());
        match result {
            Ok(()) if seen == size => {
                record(&mut lists, t.elapsed());
                done += 1;
            }
            Ok(()) => errors.add(format!("list: {seen} keys instead of {size}")),
            Err(e) => errors.add(e),
        }
    }
    let (n_errors, error_samples) = errors.take();
    let mut extra = Map::new();
    extra.insert("keys".into(), json!(size));
    extra.insert("page_limit".into(), json!(page));
    extra.insert("page".into(), summary(&pages));
    Measured {
        ops: done,
        elapsed: start.elapsed(),
        latency: lists,
        errors: n_errors,
        error_samples,
        extra,
    }
}

/// `count`: `count_only` Range over the prefix holding `size` keys, from 4 clients.
pub async fn count(ctx: &Ctx, size: u64) -> Measured {
    let prefix = list_prefix(size);
    let states: Vec<KvClient> = (0..ctx.sizes.clients.min(4)).map(|w| ctx.kv(w)).collect();
    let l = closed_loop(
        states,
        ctx.sizes.counts,
        ctx.cap(),
        1,
        None,
        move |mut kv: KvClient, _| {
            let prefix = prefix.clone();
            async move {
                let options = GetOptions::new().with_prefix().with_count_only();
                let outcome = match kv.get(prefix, Some(options)).await {
                    Ok(resp) if resp.count() == size as i64 => Ok(0),
                    Ok(resp) => Err(format!("count: {} instead of {size}", resp.count())),
                    Err(e) => Err(format!("count: {e}")),
                };
                (kv, outcome)
            }
        },
    )
    .await;
    let mut extra = Map::new();
    extra.insert("keys".into(), json!(size));
    measured(&l, l.all(), extra)
}

/// Watch streams open on some prefixes, timing each event from the writer's acknowledgement.
struct Watching {
    tasks: Vec<tokio::task::JoinHandle<(Hist, Hist, u64)>>,
    delivered: Arc<AtomicU64>,
    errors: Arc<Errors>,
    stop: CancellationToken,
    streams: usize,
}

/// Watchers per gRPC watch stream, as etcd's Go client groups watchers of one context.
const WATCHERS_PER_STREAM: usize = 10;

/// Opens one prefix watcher per entry of `prefixes`, ten per stream, streams spread over the
/// connections, and waits until every watcher is created. Each event's latency is "now" minus
/// the writer's acknowledgement time of its revision in `acks`; an event that arrives before
/// the writer saw its acknowledgement counts as 0 (etcd usually notifies watchers before the
/// writer's reply arrives). When `sent` is given (keys written once), a second histogram
/// measures from the moment the write was sent, which does not depend on who is told first.
async fn open_watchers(
    ctx: &Ctx,
    prefixes: &[String],
    acks: Arc<DashMap<i64, Instant>>,
    sent: Option<Arc<DashMap<Vec<u8>, Instant>>>,
) -> Result<Watching, String> {
    let w = Watching {
        tasks: Vec::new(),
        delivered: Arc::new(AtomicU64::new(0)),
        errors: Arc::new(Errors::default()),
        stop: CancellationToken::new(),
        streams: 0,
    };
    let mut w = w;
    for (s, group) in prefixes.chunks(WATCHERS_PER_STREAM).enumerate() {
        let mut client = ctx.clients[s % ctx.clients.len()].watch_client();
        let options = || Some(WatchOptions::new().with_prefix());
        let mut stream = client
            .watch(group[0].clone(), options())
            .await
            .map_err(|e| format!("watch: {e}"))?;
        for p in &group[1..] {
            stream
                .watch(p.clone(), options())
                .await
                .map_err(|e| format!("watch: {e}"))?;
        }
        let mut created = 0;
        while created < group.len() {
            match tokio::time::timeout(Duration::from_secs(30), stream.message()).await {
                Ok(Ok(Some(resp))) if resp.created() => created += 1,
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None)) => return Err("watch: stream ended while creating".into()),
                Ok(Err(e)) => return Err(format!("watch: {e}")),
                Err(_) => return Err("watch: no created response within 30 s".into()),
            }
        }
        let (acks, sent, delivered, errors, stop) = (
            acks.clone(),
            sent.clone(),
            w.delivered.clone(),
            w.errors.clone(),
            w.stop.clone(),
        );
        w.tasks.push(tokio::spawn(async move {
            let mut hist = new_hist();
            let mut from_send = new_hist();
            let mut before_ack = 0u64;
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    msg = stream.message() => match msg {
                        Ok(Some(resp)) => {
                            if resp.canceled() {
                                errors.add(format!("watch canceled: {}", resp.cancel_reason()));
                                break;
                            }
                            let now = Instant::now();
                            for ev in resp.events() {
                                let Some(kv) = ev.kv() else { continue };
                                match acks.get(&kv.mod_revision()) {
                                    Some(acked) => record(&mut hist, now.saturating_duration_since(*acked)),
                                    None => {
                                        record(&mut hist, Duration::ZERO);
                                        before_ack += 1;
                                    }
                                }
                                if let Some(at) = sent.as_ref().and_then(|s| s.get(kv.key()).map(|t| *t)) {
                                    record(&mut from_send, now.saturating_duration_since(at));
                                }
                                delivered.fetch_add(1, Relaxed);
                            }
                        }
                        Ok(None) => {
                            errors.add("watch: stream ended");
                            break;
                        }
                        Err(e) => {
                            errors.add(format!("watch: {e}"));
                            break;
                        }
                    }
                }
            }
            (hist, from_send, before_ack)
        }));
        w.streams += 1;
    }
    Ok(w)
}

impl Watching {
    /// Waits until `expected` events were delivered or `drain` passed, then closes the streams.
    async fn finish(self, expected: u64, drain: Duration) -> Delivery {
        let deadline = Instant::now() + drain;
        while self.delivered.load(Relaxed) < expected && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.stop.cancel();
        let mut d = Delivery {
            from_ack: new_hist(),
            from_send: new_hist(),
            delivered: self.delivered.load(Relaxed),
            before_ack: 0,
            errors: self.errors,
        };
        for t in self.tasks {
            let (h, s, b) = t.await.expect("a watcher panicked");
            d.from_ack.add(&h).expect("same bounds");
            d.from_send.add(&s).expect("same bounds");
            d.before_ack += b;
        }
        d
    }
}

/// What the watchers of one workload received.
struct Delivery {
    from_ack: Hist,
    from_send: Hist,
    delivered: u64,
    /// Events that arrived before the writer had its reply.
    before_ack: u64,
    errors: Arc<Errors>,
}

/// `watch-N`: N prefix watchers while creates run at `watch_rate` per second. Watchers are
/// spread over ceil(N / 10) namespaces (each namespace watched by up to 10), and creates over
/// the same namespaces, so every event fans out to about 10 watchers (1 when N = 1). The
/// latency is delivery latency: from the writer's acknowledgement to the watcher's receipt.
pub async fn watch(ctx: &Ctx, watchers: usize) -> Result<Measured, String> {
    let groups = watchers.div_ceil(10).max(1);
    let prefix = move |g: usize| format!("/registry/configmaps/watch{watchers}-ns-{g}/");
    let mut per_group = vec![0u64; groups];
    for w in 0..watchers {
        per_group[w % groups] += 1;
    }
    let prefixes: Vec<String> = (0..watchers).map(|w| prefix(w % groups)).collect();
    let acks = Arc::new(DashMap::new());
    let sent = Arc::new(DashMap::new());
    let watching = open_watchers(ctx, &prefixes, acks.clone(), Some(sent.clone())).await?;
    let streams = watching.streams;
    let expected = Arc::new(AtomicU64::new(0));
    let per_group = Arc::new(per_group);
    let value = ctx.value.clone();
    let total = (ctx.sizes.watch_rate * ctx.sizes.watch_secs).ceil() as u64;
    let states: Vec<KvClient> = (0..ctx.sizes.clients).map(|w| ctx.kv(w)).collect();
    let (acks2, sent2, expected2) = (acks.clone(), sent.clone(), expected.clone());
    let l = closed_loop(
        states,
        total,
        ctx.cap(),
        1,
        Some(ctx.sizes.watch_rate),
        move |mut kv: KvClient, i| {
            let (value, acks, sent, expected, per_group) = (
                value.clone(),
                acks2.clone(),
                sent2.clone(),
                expected2.clone(),
                per_group.clone(),
            );
            async move {
                let g = i as usize % per_group.len();
                let key = format!("{}cm-{i:07}", prefix(g)).into_bytes();
                sent.insert(key.clone(), Instant::now());
                let outcome = match kv.txn(create_txn(key, value.to_vec(), 0)).await {
                    Ok(resp) if resp.succeeded() => {
                        acks.insert(revision(&resp), Instant::now());
                        expected.fetch_add(per_group[g], Relaxed);
                        Ok(0)
                    }
                    Ok(_) => Err("watch: create found the key existing".to_owned()),
                    Err(e) => Err(format!("watch create: {e}")),
                };
                (kv, outcome)
            }
        },
    )
    .await;
    let expected = expected.load(Relaxed);
    let d = watching.finish(expected, Duration::from_secs(10)).await;
    if d.delivered < expected {
        l.errors.add(format!(
            "watch: {} of {expected} events never arrived",
            expected - d.delivered
        ));
    }
    l.errors.absorb(&d.errors);
    let mut extra = Map::new();
    extra.insert("watchers".into(), json!(watchers));
    extra.insert("streams".into(), json!(streams));
    extra.insert("namespaces".into(), json!(groups));
    extra.insert("write_rate".into(), json!(ctx.sizes.watch_rate));
    extra.insert("write".into(), summary(&l.all()));
    extra.insert("events_expected".into(), json!(expected));
    extra.insert("events_delivered".into(), json!(d.delivered));
    extra.insert("events_before_ack".into(), json!(d.before_ack));
    extra.insert("delivery_from_send".into(), summary(&d.from_send));
    Ok(measured(&l, d.from_ack, extra))
}

/// Operation kinds of `mixed`, for per-kind latencies.
const MIXED_KINDS: [&str; 5] = ["update", "get", "create_event", "list", "count"];

/// `mixed`: a kube-apiserver-like blend for `mixed_secs`: 45% GuaranteedUpdate (5% of those
/// stale), 30% get, 10% event creates attached to a lease, 14.9% namespace lists (limit 500),
/// 0.1% count_only over all configmaps; meanwhile one watcher per namespace on the
/// configmaps, and a lease granted every 2 s (TTL 3660 s, as for events).
pub async fn mixed(ctx: &mut Ctx) -> Result<Measured, String> {
    ensure_configmaps(ctx).await?;
    let namespaces = ctx.sizes.namespaces as u64;
    let prefixes: Vec<String> = (0..namespaces)
        .map(|n| format!("/registry/configmaps/ns-{n}/"))
        .collect();
    let acks = Arc::new(DashMap::new());
    let watching = open_watchers(ctx, &prefixes, acks.clone(), None).await?;

    let lease = Arc::new(AtomicI64::new(0));
    let mut lease_client = ctx.clients[0].lease_client();
    let first = lease_client
        .grant(3660, None)
        .await
        .map_err(|e| format!("lease grant: {e}"))?;
    lease.store(first.id(), Relaxed);
    let stop_leases = CancellationToken::new();
    let granter = {
        let (lease, stop) = (lease.clone(), stop_leases.clone());
        tokio::spawn(async move {
            let mut grants = new_hist();
            let mut failures = 0u64;
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
                let t = Instant::now();
                match lease_client.grant(3660, None).await {
                    Ok(resp) => {
                        record(&mut grants, t.elapsed());
                        lease.store(resp.id(), Relaxed);
                    }
                    Err(_) => failures += 1,
                }
            }
            (grants, failures)
        })
    };

    let stale_percent = ctx.sizes.stale_percent;
    let all_keys: Arc<Vec<Vec<u8>>> =
        Arc::new(ctx.configmaps.iter().map(|(k, _)| k.clone()).collect());
    let value = ctx.value.clone();
    let page = ctx.sizes.list_page;
    let states: Vec<(Updater, u64)> = updaters(ctx, 300).into_iter().map(|u| (u, 0)).collect();
    let acks2 = acks.clone();
    let l = closed_loop(
        states,
        u64::MAX,
        Duration::from_secs_f64(ctx.sizes.mixed_secs.min(ctx.sizes.max_secs)),
        MIXED_KINDS.len(),
        None,
        move |(mut u, mut events): (Updater, u64), i| {
            let (value, all_keys, lease, acks) = (
                value.clone(),
                all_keys.clone(),
                lease.clone(),
                acks2.clone(),
            );
            async move {
                let roll = u.rng.random_range(0..1000);
                let outcome = if roll < 450 {
                    match u.update(stale_percent, value.to_vec()).await {
                        Ok((rev, false)) => {
                            acks.insert(rev, Instant::now());
                            Ok(0)
                        }
                        Ok((_, true)) => Ok(0),
                        Err(e) => Err(e),
                    }
                } else if roll < 750 {
                    let key = all_keys[u.rng.random_range(0..all_keys.len())].clone();
                    match u.kv.get(key, None).await {
                        Ok(resp) if resp.kvs().len() == 1 => Ok(1),
                        Ok(_) => Err("mixed get: an existing key was not found".to_owned()),
                        Err(e) => Err(format!("mixed get: {e}")),
                    }
                } else if roll < 850 {
                    events += 1;
                    let key = format!("/registry/events/ns-{}/ev-{i}", i % namespaces);
                    let txn = create_txn(key.into_bytes(), value.to_vec(), lease.load(Relaxed));
                    match u.kv.txn(txn).await {
                        Ok(resp) if resp.succeeded() => Ok(2),
                        Ok(_) => Err("mixed event: the key already exists".to_owned()),
                        Err(e) => Err(format!("mixed event: {e}")),
                    }
                } else if roll < 999 {
                    let ns = u.rng.random_range(0..namespaces);
                    let prefix = format!("/registry/configmaps/ns-{ns}/");
                    let options = GetOptions::new()
                        .with_range(prefix_end(&prefix))
                        .with_limit(page);
                    match u.kv.get(prefix, Some(options)).await {
                        Ok(_) => Ok(3),
                        Err(e) => Err(format!("mixed list: {e}")),
                    }
                } else {
                    let options = GetOptions::new().with_prefix().with_count_only();
                    match u.kv.get("/registry/configmaps/", Some(options)).await {
                        Ok(_) => Ok(4),
                        Err(e) => Err(format!("mixed count: {e}")),
                    }
                };
                ((u, events), outcome)
            }
        },
    )
    .await;
    stop_leases.cancel();
    let (grants, grant_failures) = granter.await.expect("the lease granter panicked");
    // Every acknowledged non-stale update is one event for the one watcher of its namespace.
    let expected = acks.len() as u64;
    let d = watching.finish(expected, Duration::from_secs(10)).await;
    let mut extra = Map::new();
    for (kind, h) in MIXED_KINDS.iter().zip(&l.by_kind) {
        extra.insert((*kind).into(), summary(h));
    }
    extra.insert("lease_grant".into(), summary(&grants));
    extra.insert("watchers".into(), json!(prefixes.len()));
    extra.insert("watch_delivery".into(), summary(&d.from_ack));
    extra.insert("events_expected".into(), json!(expected));
    extra.insert("events_delivered".into(), json!(d.delivered));
    extra.insert("events_before_ack".into(), json!(d.before_ack));
    if grant_failures > 0 {
        l.errors
            .add(format!("{grant_failures} lease grants failed"));
    }
    if d.delivered < expected {
        l.errors.add(format!(
            "mixed watch: {} of {expected} events never arrived",
            expected - d.delivered
        ));
    }
    l.errors.absorb(&d.errors);
    let m = measured(&l, l.all(), extra);
    give_back(ctx, l.states.into_iter().map(|(u, _)| u));
    Ok(m)
}

/// Open-loop sweep of GuaranteedUpdate txns: at each offered rate, requests are *due* at fixed
/// intervals whatever the server does, and latency counts from the due time. Stops after the
/// first rate the server could not sustain (below 80% of it). `cpu` reads the server's CPU
/// seconds (with its database's, for PostgreSQL).
pub async fn sweep(ctx: &mut Ctx, cpu: &dyn Fn() -> f64) -> Result<Vec<SweepPoint>, String> {
    ensure_configmaps(ctx).await?;
    let pool: Arc<Mutex<VecDeque<Known>>> =
        Arc::new(Mutex::new(ctx.configmaps.drain(..).collect()));
    let in_flight_cap = pool.lock().unwrap().len().min(1024);
    let mut points = Vec::new();
    for &rate in &ctx.sizes.sweep_rates {
        let n = (rate * ctx.sizes.sweep_secs).ceil() as u64;
        let gate = Arc::new(Semaphore::new(in_flight_cap));
        let hist = Arc::new(Mutex::new(new_hist()));
        let errors = Arc::new(Errors::default());
        let done = Arc::new(AtomicU64::new(0));
        let cpu_before = cpu();
        let (busy_before, me_before) = (
            crate::system::machine_busy_seconds(),
            crate::system::self_cpu_seconds(),
        );
        let start = Instant::now() + Duration::from_millis(10);
        let deadline = start + ctx.cap();
        for i in 0..n {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            pace_until(due).await;
            if Instant::now() > deadline {
                break;
            }
            let permit = gate.clone().acquire_owned().await.expect("never closed");
            let (pool, hist, errors, done) =
                (pool.clone(), hist.clone(), errors.clone(), done.clone());
            let mut kv = ctx.kv(i as usize);
            let value = ctx.value.to_vec();
            tokio::spawn(async move {
                let _permit = permit;
                let Some((key, rev)) = pool.lock().unwrap().pop_front() else {
                    errors.add("sweep: more requests in flight than keys");
                    return;
                };
                let outcome = guaranteed_update(&mut kv, &key, rev, value).await;
                let now = match &outcome {
                    Ok((now, _)) => *now,
                    Err(_) => rev,
                };
                pool.lock().unwrap().push_back((key, now));
                match outcome {
                    Ok((_, false)) => {
                        record(&mut hist.lock().unwrap(), due.elapsed());
                        done.fetch_add(1, Relaxed);
                    }
                    Ok((_, true)) => errors.add("sweep: unexpected conflict"),
                    Err(e) => errors.add(e),
                }
            });
        }
        let _all = gate
            .acquire_many(in_flight_cap as u32)
            .await
            .expect("never closed");
        let elapsed = start.elapsed().as_secs_f64();
        let done = done.load(Relaxed);
        let hist = hist.lock().unwrap().clone();
        let server_cpu = cpu() - cpu_before;
        let busy = crate::system::machine_busy_seconds() - busy_before;
        let me = crate::system::self_cpu_seconds() - me_before;
        let point = SweepPoint {
            offered: rate,
            achieved: done as f64 / elapsed,
            p50_ms: ms(&hist, 0.5),
            p99_ms: ms(&hist, 0.99),
            p999_ms: ms(&hist, 0.999),
            errors: errors.take().0,
            server_cpu_ms_per_op: server_cpu * 1000.0 / done.max(1) as f64,
            other_cpu_s: (busy - server_cpu - me).max(0.0),
        };
        eprintln!(
            "    sweep {rate:>7.0}/s offered: {:>7.0}/s achieved, p50 {:.2} ms, p99 {:.2} ms, other cpu {:.1} s",
            point.achieved, point.p50_ms, point.p99_ms, point.other_cpu_s
        );
        let saturated = point.achieved < 0.8 * rate;
        points.push(point);
        if saturated {
            break;
        }
    }
    ctx.configmaps = pool.lock().unwrap().drain(..).collect();
    Ok(points)
}
