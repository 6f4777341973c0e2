//! The Watch service: one task per gRPC stream speaks etcd's watch protocol on top of the hub.
//!
//! Per stream, in the order things happen:
//! - A create request is answered `created` (with the current revision) before anything else
//!   about that watch id; a start revision below the compact revision is then cancelled with
//!   `compact_revision` set, as etcd does.
//! - A new watcher is *unsynced*: the stream replays the log from its start revision, one chunk
//!   at a time between other work, until it has seen everything the hub has published, and then
//!   joins the hub (see the seam rule in [`crate::watch`]). From then on it receives live
//!   batches. If the stream's queue overflows, every watcher goes back to unsynced and catches
//!   up the same way.
//! - A progress request is answered (`watch_id = -1`) with a revision R ≥ the current revision
//!   at the time of the request, once every watcher of the stream is synced and every batch up
//!   to R has been handed to it: an event at or below R can never follow.
//! - An event carries `prev_kv` (when asked) only if the revision just before it is at or above
//!   the compact revision, as etcd decides: etcd reads the previous version at revision − 1 and
//!   sends the event without it when that read is compacted. kube-apiserver turns the absence
//!   into the 410 of a watch resumed from a compacted revision. The compact revision used is the
//!   newest the stream has read (at each catch-up chunk and create): a live event whose
//!   revision a compaction passes between its commit and its delivery keeps its `prev_kv`.
//! - `progress_notify` watchers get an empty response with the delivered revision at each
//!   interval in which they received nothing, under the same condition.
//! - The loop never spins: a catch-up that could neither read nor join a watcher is not tried
//!   again until something it waits on happens (H moves, the hub reports a lag, a request or a
//!   batch arrives). A stream that stays behind — a watcher not yet synced, or a progress request
//!   not yet answered — for [`BEHIND_WARNING`] is logged as a warning, again every
//!   [`BEHIND_REPEAT`] while it lasts, and counted in `etcdsql_watch_stream_behind_seconds`.
//!   (A stream blocked sending to a client that does not read logs once the send goes through;
//!   the gauge, read at scrape time, counts it all along.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use super::ServerInfo;
use super::auth::{Callers, Credentials};
use super::kv::kv_to_pb;
use crate::auth::Access;
use crate::metrics::{Metrics, WatchGauges};
use crate::mvcc::Store;
use crate::mvcc::types::KeyRange;
use crate::pb::etcdserverpb as pb;
use crate::pb::mvccpb;
use crate::watch::{Batch, Event, EventKind, Hub, READ_CHUNK, Subscription};

/// Responses a stream may have waiting for the client before it stops reading the hub.
const OUT_QUEUE: usize = 64;
/// How long a stream may be behind before it is logged: far longer than replaying a normal
/// backlog takes, far shorter than kube-apiserver would notice a stale watch cache.
const BEHIND_WARNING: Duration = Duration::from_secs(5);
/// How often a stream that stays behind is logged again.
const BEHIND_REPEAT: Duration = Duration::from_secs(30);

/// etcd's reasons for refusing a watch, sent as `cancel_reason`.
const EMPTY_RANGE: &str = "mvcc: watcher range is empty";
const DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";

pub struct WatchService {
    hub: Hub,
    store: Store,
    info: ServerInfo,
    progress_interval: Duration,
    shutdown: CancellationToken,
    metrics: Metrics,
    callers: Callers,
}

impl WatchService {
    pub fn new(
        hub: Hub,
        store: Store,
        info: ServerInfo,
        progress_interval: Duration,
        shutdown: CancellationToken,
        metrics: Metrics,
        callers: Callers,
    ) -> Self {
        Self {
            hub,
            store,
            info,
            progress_interval,
            shutdown,
            metrics,
            callers,
        }
    }
}

impl WatchService {
    /// Serves one watch stream: `inbound` carries the client's requests (gRPC, or the JSON
    /// gateway's body), the answer is the stream of responses.
    pub fn open<S>(
        &self,
        credentials: Credentials,
        inbound: S,
    ) -> ReceiverStream<Result<pb::WatchResponse, Status>>
    where
        S: Stream<Item = Result<pb::WatchRequest, Status>> + Unpin + Send + 'static,
    {
        let (out, responses) = mpsc::channel(OUT_QUEUE);
        let (sub, batches) = self.hub.subscribe();
        let stream = WatchStream {
            sub,
            store: self.store.clone(),
            info: self.info.clone(),
            out,
            watchers: BTreeMap::new(),
            next_id: 0,
            progress_target: None,
            progress_pending: 0,
            compact: 0,
            gauges: self.metrics.watch_stream(),
            metrics: self.metrics.clone(),
            callers: self.callers.clone(),
            credentials,
        };
        tokio::spawn(stream.run(
            inbound,
            batches,
            self.progress_interval,
            self.shutdown.clone(),
        ));
        ReceiverStream::new(responses)
    }
}

#[tonic::async_trait]
impl pb::watch_server::Watch for WatchService {
    type WatchStream = ReceiverStream<Result<pb::WatchResponse, Status>>;

    async fn watch(
        &self,
        request: Request<Streaming<pb::WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let credentials = Credentials::of(&request);
        Ok(Response::new(self.open(credentials, request.into_inner())))
    }
}

struct Watcher {
    range: KeyRange,
    /// Every event below this revision has been sent (or did not concern the watcher).
    next_rev: i64,
    prev_kv: bool,
    no_put: bool,
    no_delete: bool,
    progress_notify: bool,
    fragment: bool,
    /// In the hub's index, receiving live batches.
    synced: bool,
    /// Sent something since the last progress tick.
    active: bool,
}

impl Watcher {
    /// The events of `events` this watcher has not seen and wants, in etcd's wire form, given
    /// the compact revision.
    fn select(&self, events: &[Event], compact: i64) -> Vec<mvccpb::Event> {
        events
            .iter()
            .filter(|e| e.revision() >= self.next_rev && self.range.contains(&e.kv.key))
            .filter(|e| match e.kind {
                EventKind::Put => !self.no_put,
                EventKind::Delete => !self.no_delete,
            })
            .map(|e| mvccpb::Event {
                r#type: match e.kind {
                    EventKind::Put => mvccpb::event::EventType::Put as i32,
                    EventKind::Delete => mvccpb::event::EventType::Delete as i32,
                },
                kv: Some(kv_to_pb(e.kv.clone())),
                prev_kv: if self.prev_kv && e.revision() > compact {
                    e.prev_kv.clone().map(kv_to_pb)
                } else {
                    None
                },
            })
            .collect()
    }
}

/// The client went away; the stream ends.
struct Closed;

enum Step {
    /// A request; `None` when the client closed its side of the stream.
    Request(Option<pb::WatchRequest>),
    /// The client went away, or its side of the stream failed.
    ClientGone,
    Batch(Option<Arc<Batch>>),
    Lagged,
    Delivered,
    Tick,
    CatchUp,
    Behind,
    Shutdown,
}

/// When a stream fell behind, and when it is next to be logged.
struct Behind {
    since: Instant,
    warn_at: Instant,
    warned: bool,
}

struct WatchStream {
    sub: Subscription,
    store: Store,
    info: ServerInfo,
    out: mpsc::Sender<Result<pb::WatchResponse, Status>>,
    watchers: BTreeMap<i64, Watcher>,
    /// Next automatic watch id (etcd starts at 0).
    next_id: i64,
    /// The revision pending progress requests must reach, and how many are waiting.
    progress_target: Option<i64>,
    progress_pending: usize,
    /// The newest compact revision the stream has read, for the `prev_kv` rule.
    compact: i64,
    /// This stream's watchers in the watcher gauges; released when the stream ends.
    gauges: WatchGauges,
    metrics: Metrics,
    callers: Callers,
    /// The stream's token or certificate, resolved again at each create.
    credentials: Credentials,
}

impl WatchStream {
    async fn run<S>(
        mut self,
        mut inbound: S,
        mut batches: mpsc::Receiver<Arc<Batch>>,
        progress_interval: Duration,
        shutdown: CancellationToken,
    ) where
        S: Stream<Item = Result<pb::WatchRequest, Status>> + Unpin,
    {
        let mut delivered = self.sub.hub().delivered_changes();
        // As etcd: a client that stops sending (closes its side) keeps its watches until it
        // goes away.
        let mut reading = true;
        let mut ticker = tokio::time::interval_at(
            tokio::time::Instant::now() + progress_interval,
            progress_interval,
        );
        let mut retry = Duration::from_millis(20);
        // The last catch-up could neither read nor join anything: wait for a signal first.
        let mut stalled = false;
        let mut behind: Option<Behind> = None;
        loop {
            if self.sub.lagged() && self.absorb_lag(&mut batches).await.is_err() {
                return;
            }
            if self.answer_progress(&batches).await.is_err() {
                return;
            }
            let unsynced = self.watchers.values().filter(|w| !w.synced).count();
            self.gauges.set(self.watchers.len(), unsynced);
            self.track_behind(&mut behind, unsynced);
            let catching_up = unsynced > 0 && !stalled;
            let warn_at = behind.as_ref().map(|b| b.warn_at);
            let step = tokio::select! {
                biased;
                () = shutdown.cancelled() => Step::Shutdown,
                () = self.out.closed() => Step::ClientGone,
                request = inbound.next(), if reading => match request {
                    Some(Ok(request)) => Step::Request(Some(request)),
                    Some(Err(_)) => Step::ClientGone,
                    None => Step::Request(None),
                },
                batch = batches.recv() => Step::Batch(batch),
                () = self.sub.lag_signalled() => Step::Lagged,
                _ = delivered.changed(), if self.progress_target.is_some() || stalled => {
                    Step::Delivered
                }
                _ = ticker.tick() => Step::Tick,
                () = tokio::time::sleep_until(warn_at.unwrap_or_else(Instant::now)),
                    if warn_at.is_some() => Step::Behind,
                () = std::future::ready(()), if catching_up => Step::CatchUp,
            };
            if matches!(
                step,
                Step::Request(_) | Step::Batch(_) | Step::Lagged | Step::Delivered
            ) {
                stalled = false;
            }
            let outcome = match step {
                Step::Shutdown => {
                    let _ = self
                        .out
                        .send(Err(Status::unavailable("etcdserver: server stopped")))
                        .await;
                    return;
                }
                Step::ClientGone | Step::Batch(None) => return,
                Step::Request(None) => {
                    reading = false;
                    Ok(())
                }
                Step::Request(Some(request)) => self.handle(request).await,
                Step::Batch(Some(batch)) => self.deliver(&batch).await,
                Step::Lagged | Step::Delivered => Ok(()),
                Step::Tick => self.notify_progress(&batches).await,
                Step::Behind => {
                    if let Some(behind) = behind.as_mut() {
                        self.warn_behind(behind.since);
                        behind.warn_at = Instant::now() + BEHIND_REPEAT;
                        behind.warned = true;
                    }
                    Ok(())
                }
                Step::CatchUp => match self.catch_up().await {
                    Ok(progressed) => {
                        stalled = !progressed;
                        retry = Duration::from_millis(20);
                        Ok(())
                    }
                    Err(CatchUpError::Closed) => Err(Closed),
                    Err(CatchUpError::Store(e)) => {
                        tracing::warn!(error = %e, "watch catch-up cannot read the log; retrying");
                        tokio::time::sleep(retry).await;
                        retry = (retry * 2).min(Duration::from_secs(2));
                        Ok(())
                    }
                },
            };
            if outcome.is_err() {
                return;
            }
        }
    }

    /// Starts or ends the stream's time behind: it is behind while a watcher is unsynced or a
    /// progress request waits.
    fn track_behind(&mut self, behind: &mut Option<Behind>, unsynced: usize) {
        let is_behind = unsynced > 0 || self.progress_target.is_some();
        match (is_behind, behind.as_ref()) {
            (true, None) => {
                let since = Instant::now();
                *behind = Some(Behind {
                    since,
                    warn_at: since + BEHIND_WARNING,
                    warned: false,
                });
                self.gauges.behind(Some(since.into_std()));
            }
            (false, Some(was)) => {
                if was.warned {
                    tracing::info!(
                        behind_ms = was.since.elapsed().as_millis() as u64,
                        "watch stream caught up"
                    );
                }
                *behind = None;
                self.gauges.behind(None);
            }
            _ => {}
        }
    }

    fn warn_behind(&self, since: Instant) {
        let oldest = self
            .watchers
            .iter()
            .filter(|(_, w)| !w.synced)
            .min_by_key(|(_, w)| w.next_rev);
        tracing::warn!(
            behind_ms = since.elapsed().as_millis() as u64,
            unsynced = self.watchers.values().filter(|w| !w.synced).count(),
            oldest_watch_id = oldest.map(|(id, _)| *id),
            oldest_next_revision = oldest.map(|(_, w)| w.next_rev),
            progress_target = self.progress_target,
            hub_delivered = self.sub.hub().delivered(),
            "watch stream is behind: events or progress responses are late"
        );
    }

    async fn send(&self, response: pb::WatchResponse) -> Result<(), Closed> {
        self.out.send(Ok(response)).await.map_err(|_| Closed)
    }

    fn response(&self, watch_id: i64, revision: i64) -> pb::WatchResponse {
        pb::WatchResponse {
            header: self.info.header(revision),
            watch_id,
            ..Default::default()
        }
    }

    async fn handle(&mut self, request: pb::WatchRequest) -> Result<(), Closed> {
        use pb::watch_request::RequestUnion;
        match request.request_union {
            Some(RequestUnion::CreateRequest(create)) => self.create(create).await,
            Some(RequestUnion::CancelRequest(cancel)) => {
                if self.watchers.remove(&cancel.watch_id).is_some() {
                    self.sub.leave(cancel.watch_id);
                    let mut response = self.response(cancel.watch_id, self.sub.hub().delivered());
                    response.canceled = true;
                    self.send(response).await?;
                }
                Ok(())
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                let current = match self.store.revisions().await {
                    Ok(revisions) => revisions.current,
                    Err(e) => {
                        let _ = self.out.send(Err(Status::from(e))).await;
                        return Err(Closed);
                    }
                };
                self.progress_target = Some(self.progress_target.unwrap_or(0).max(current));
                self.progress_pending += 1;
                Ok(())
            }
            None => Ok(()),
        }
    }

    async fn create(&mut self, create: pb::WatchCreateRequest) -> Result<(), Closed> {
        // etcd: an empty key means the smallest key.
        let key = if create.key.is_empty() {
            vec![0]
        } else {
            create.key
        };
        let range = KeyRange::from_etcd(key, create.range_end);
        let revisions = match self.store.revisions().await {
            Ok(revisions) => revisions,
            Err(e) => {
                let _ = self.out.send(Err(Status::from(e))).await;
                return Err(Closed);
            }
        };
        let refuse = |id: i64, reason: &str| {
            let mut response = self.response(id, revisions.current);
            response.created = true;
            response.canceled = true;
            response.cancel_reason = reason.to_owned();
            response
        };
        let permitted = self.callers.resolve(&self.credentials).and_then(|caller| {
            self.callers
                .auth()
                .check_keys(caller.as_ref(), &range, Access::Read)
        });
        if let Err(denied) = permitted {
            // etcd sends the gRPC error's text, code included.
            let status = Status::from(denied);
            let reason = format!(
                "rpc error: code = {} desc = {}",
                grpc_code_name(status.code()),
                status.message()
            );
            return self.send(refuse(-1, &reason)).await;
        }
        if range.is_empty() {
            return self.send(refuse(-1, EMPTY_RANGE)).await;
        }
        let id = if create.watch_id != 0 {
            if self.watchers.contains_key(&create.watch_id) {
                return self.send(refuse(create.watch_id, DUPLICATE_ID)).await;
            }
            create.watch_id
        } else {
            while self.watchers.contains_key(&self.next_id) {
                self.next_id += 1;
            }
            self.next_id += 1;
            self.next_id - 1
        };
        let mut created = self.response(id, revisions.current);
        created.created = true;
        self.send(created).await?;

        self.compact = self.compact.max(revisions.compact);
        if create.start_revision > 0 && create.start_revision < revisions.compact {
            // etcd's compacted cancellation carries no revision in its header.
            let mut compacted = self.response(id, 0);
            compacted.canceled = true;
            compacted.compact_revision = revisions.compact;
            return self.send(compacted).await;
        }
        let next_rev = if create.start_revision > 0 {
            create.start_revision
        } else {
            revisions.current + 1
        };
        let filters =
            |f: pb::watch_create_request::FilterType| create.filters.contains(&(f as i32));
        let mut watcher = Watcher {
            range,
            next_rev,
            prev_kv: create.prev_kv,
            no_put: filters(pb::watch_create_request::FilterType::Noput),
            no_delete: filters(pb::watch_create_request::FilterType::Nodelete),
            progress_notify: create.progress_notify,
            fragment: create.fragment,
            synced: false,
            active: false,
        };
        // Starting at or after what the hub has published: no replay needed.
        watcher.synced = self.sub.join(id, &watcher.range, next_rev).is_ok();
        self.watchers.insert(id, watcher);
        Ok(())
    }

    /// Sends a live batch to the synced watchers it concerns.
    async fn deliver(&mut self, batch: &Batch) -> Result<(), Closed> {
        let mut responses = Vec::new();
        for (id, watcher) in self.watchers.iter_mut().filter(|(_, w)| w.synced) {
            let events = watcher.select(&batch.events, self.compact);
            watcher.next_rev = watcher.next_rev.max(batch.through + 1);
            if !events.is_empty() {
                watcher.active = true;
                responses.push((*id, watcher.fragment, events));
            }
        }
        for (id, fragment, events) in responses {
            self.send_events(id, fragment, events, batch.through)
                .await?;
        }
        Ok(())
    }

    /// Sends one watcher's events, split into fragments if it asked for that and they exceed
    /// the request size limit.
    async fn send_events(
        &self,
        id: i64,
        fragment: bool,
        events: Vec<mvccpb::Event>,
        revision: i64,
    ) -> Result<(), Closed> {
        if let Some(oldest) = events.first().and_then(|e| e.kv.as_ref()) {
            self.metrics
                .watch_delivered(events.len(), oldest.mod_revision);
        }
        let mut response = self.response(id, revision);
        response.events = events;
        let limit = self.info.max_request_bytes;
        if !fragment || prost::Message::encoded_len(&response) <= limit {
            return self.send(response).await;
        }
        let mut chunk = Vec::new();
        let mut size = 0;
        let events = std::mem::take(&mut response.events);
        let mut chunks = Vec::new();
        for event in events {
            let event_size = prost::Message::encoded_len(&event);
            if !chunk.is_empty() && size + event_size > limit {
                chunks.push(std::mem::take(&mut chunk));
                size = 0;
            }
            size += event_size;
            chunk.push(event);
        }
        chunks.push(chunk);
        let last = chunks.len() - 1;
        for (i, events) in chunks.into_iter().enumerate() {
            let mut part = response.clone();
            part.events = events;
            part.fragment = i < last;
            self.send(part).await?;
        }
        Ok(())
    }

    /// The hub dropped this stream's watchers: send what is queued, then catch up from the log.
    async fn absorb_lag(&mut self, batches: &mut mpsc::Receiver<Arc<Batch>>) -> Result<(), Closed> {
        while let Ok(batch) = batches.try_recv() {
            self.deliver(&batch).await?;
        }
        for watcher in self.watchers.values_mut() {
            watcher.synced = false;
        }
        self.sub.clear_lag();
        Ok(())
    }

    /// Replays one chunk of the log to the unsynced watchers, then lets those that have seen
    /// everything the hub published join it. Returns whether it read a chunk or a watcher
    /// joined: if neither, trying again before H moves (or the lag clears) would change nothing.
    async fn catch_up(&mut self) -> Result<bool, CatchUpError> {
        let hub = self.sub.hub().clone();
        let delivered = hub.delivered();
        let from = self
            .watchers
            .values()
            .filter(|w| !w.synced)
            .map(|w| w.next_rev)
            .min();
        let mut progressed = false;
        if let Some(from) = from.filter(|from| *from <= delivered) {
            progressed = true;
            let through = (from - 1 + READ_CHUNK).min(delivered);
            let (revisions, events) = hub.read_changes(from - 1, through).await?;
            self.compact = self.compact.max(revisions.compact);
            let compacted: Vec<i64> = self
                .watchers
                .iter()
                .filter(|(_, w)| !w.synced && w.next_rev < revisions.compact)
                .map(|(id, _)| *id)
                .collect();
            for id in compacted {
                self.watchers.remove(&id);
                let mut response = self.response(id, 0);
                response.canceled = true;
                response.compact_revision = revisions.compact;
                self.send(response)
                    .await
                    .map_err(|_| CatchUpError::Closed)?;
            }
            let mut responses = Vec::new();
            for (id, watcher) in self.watchers.iter_mut().filter(|(_, w)| !w.synced) {
                if watcher.next_rev > through {
                    continue;
                }
                let selected = watcher.select(&events, self.compact);
                watcher.next_rev = through + 1;
                if !selected.is_empty() {
                    watcher.active = true;
                    responses.push((*id, watcher.fragment, selected));
                }
            }
            for (id, fragment, events) in responses {
                self.send_events(id, fragment, events, through)
                    .await
                    .map_err(|_| CatchUpError::Closed)?;
            }
        }
        for (id, watcher) in self.watchers.iter_mut().filter(|(_, w)| !w.synced) {
            watcher.synced = self.sub.join(*id, &watcher.range, watcher.next_rev).is_ok();
            progressed |= watcher.synced;
        }
        Ok(progressed)
    }

    /// Answers waiting progress requests once every event up to the delivered revision has been
    /// handed to the client and that revision reached the requests' target.
    async fn answer_progress(
        &mut self,
        batches: &mpsc::Receiver<Arc<Batch>>,
    ) -> Result<(), Closed> {
        let Some(target) = self.progress_target else {
            return Ok(());
        };
        let Some(revision) = self.quiet_revision(batches) else {
            return Ok(());
        };
        if revision < target {
            return Ok(());
        }
        for _ in 0..self.progress_pending {
            self.send(self.response(-1, revision)).await?;
        }
        self.progress_target = None;
        self.progress_pending = 0;
        Ok(())
    }

    /// The delivered revision, if every watcher is synced and nothing is queued: then every
    /// event at or below it has already been sent.
    fn quiet_revision(&self, batches: &mpsc::Receiver<Arc<Batch>>) -> Option<i64> {
        // Read H before looking at the queue: the hub queues batches before it moves H.
        let revision = self.sub.hub().delivered();
        let quiet = batches.is_empty() && self.watchers.values().all(|w| w.synced);
        quiet.then_some(revision)
    }

    /// Periodic progress for `progress_notify` watchers that received nothing lately.
    async fn notify_progress(
        &mut self,
        batches: &mpsc::Receiver<Arc<Batch>>,
    ) -> Result<(), Closed> {
        let Some(revision) = self.quiet_revision(batches) else {
            return Ok(());
        };
        let idle: Vec<i64> = self
            .watchers
            .iter()
            .filter(|(_, w)| w.progress_notify && !w.active)
            .map(|(id, _)| *id)
            .collect();
        for watcher in self.watchers.values_mut() {
            watcher.active = false;
        }
        for id in idle {
            self.send(self.response(id, revision)).await?;
        }
        Ok(())
    }
}

/// A gRPC code as Go's grpc library names it in error texts.
fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

enum CatchUpError {
    Closed,
    Store(crate::mvcc::Error),
}

impl From<crate::mvcc::Error> for CatchUpError {
    fn from(e: crate::mvcc::Error) -> Self {
        CatchUpError::Store(e)
    }
}
