//! Reading a running etcd over its own API into etcdsql's backup format, so that `etcdsql
//! import --from-etcd` restores it into any backend with revisions, versions and leases kept.
//!
//! The import stands at one revision R, the source's current revision when it starts; later
//! writes to the source are not copied.
//! - Without history: every key live at R (a paginated Range at R), each at its own mod
//!   revision, and R becomes the compact revision: reads below R are `Compacted`, as after a
//!   compaction at R.
//! - With history: a watch from revision 2 learns the source's compact revision C (etcd answers
//!   a watch that starts too early with it); the keys live at C come from a Range at C, and every
//!   change in (C, R] from a watch from C + 1, so reads at any revision from C to R and watches
//!   from C on answer as the source would. A never-compacted source replays from revision 2.
//!
//! Sub-revisions (the order of a txn's changes inside its revision) come from the watch, in the
//! order etcd sends them; for the keys read by Range, several keys written at one revision are
//! numbered in key order, which etcd does not record.
//!
//! [`follow`] (`--follow`) then applies the source's later changes through the store's own
//! write path, one txn per etcd revision, so the store's revisions stay the source's.
//!
//! Leases are copied with their granted TTL and their remaining time. A lease a copied key names
//! that the source no longer lists (revoked or expired after R) is copied as already expired, so
//! etcdsql's lessor deletes its keys as the source did.
//!
//! Invariants: the source is only read; every wait on it is bounded ([`WAIT`]); the file is
//! written in one transaction (`backend::log_file`), so a failed import leaves nothing to restore.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::backend::LeaseRow;
use crate::backend::log_file::{Change, Imported, LogFile};
use crate::mvcc::types::{DeleteRequest, KeyRange, Op, PutRequest, TxnRequest};
use crate::pb::etcdserverpb::{
    LeaseLeasesRequest, LeaseTimeToLiveRequest, RangeRequest, WatchCreateRequest, WatchRequest,
    WatchResponse, kv_client::KvClient, lease_client::LeaseClient, watch_client::WatchClient,
    watch_request::RequestUnion,
};
use crate::pb::mvccpb::{KeyValue, event::EventType};

/// Longest the source may take to answer one request or send the next watch response.
pub const WAIT: Duration = Duration::from_secs(60);
/// Keys in the first Range page; later pages aim at [`PAGE_BYTES`].
const FIRST_PAGE: i64 = 1000;
/// What a Range page should about weigh. Fewer, larger pages: etcd counts every key left in
/// the range for each page it answers, so the number of pages multiplies that cost.
const PAGE_BYTES: usize = 32 * 1024 * 1024;
/// The most keys per page.
const MAX_PAGE: i64 = 100_000;
/// Largest message the source may send (a page of large values).
const MAX_MESSAGE: usize = 512 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid etcd endpoint {0:?}")]
    Endpoint(String),
    #[error("cannot read {path}: {source}")]
    ReadFile {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "an https:// endpoint needs --from-etcd-cacert (the CA that signed etcd's certificate)"
    )]
    NoCa,
    #[error("cannot connect to etcd: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("etcd refused a request: {}", .0.message())]
    Rpc(#[from] tonic::Status),
    #[error("etcd did not answer within {} s", WAIT.as_secs())]
    Timeout,
    #[error("etcd ended the watch of its history: {0}")]
    WatchEnded(String),
    #[error("etcd compacted its history at revision {0} during the import; run the import again")]
    CompactedMeanwhile(i64),
    #[error(transparent)]
    Backend(#[from] crate::backend::Error),
    #[error("the store refused a change from etcd: {0}")]
    Store(String),
    #[error(
        "etcd's revision {etcd} became the store's {store}: something else writes to the store"
    )]
    Diverged { etcd: i64, store: i64 },
    #[error("the etcd to export into holds {0} keys already; export writes only into an empty one")]
    TargetNotEmpty(i64),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Where the source etcd is and how to reach it.
#[derive(Clone, Debug, Default)]
pub struct Source {
    /// `http://HOST:PORT`, `https://HOST:PORT`, or `HOST:PORT` (https when a CA is given).
    pub endpoint: String,
    /// The CA that signed the source's certificate.
    pub cacert: Option<PathBuf>,
    /// A client certificate and its key, for a source that asks for one.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl Source {
    pub(crate) async fn connect(&self) -> Result<Channel> {
        let url = if self.endpoint.contains("://") {
            self.endpoint.clone()
        } else if self.cacert.is_some() {
            format!("https://{}", self.endpoint)
        } else {
            format!("http://{}", self.endpoint)
        };
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(|_| Error::Endpoint(self.endpoint.clone()))?
            .connect_timeout(Duration::from_secs(10));
        if url.starts_with("https://") {
            let ca = self.cacert.as_deref().ok_or(Error::NoCa)?;
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
            if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
                tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            endpoint = endpoint.tls_config(tls)?;
        }
        Ok(endpoint.connect().await?)
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::ReadFile {
        path: path.display().to_string(),
        source,
    })
}

/// Copies the source at its current revision into a new backup file at `dest` (with its
/// history from its compact revision on, if `with_history`); `progress` hears how many rows
/// are written and about how many there will be.
///
/// # Errors
/// The source cannot be reached or read, or the file cannot be written.
pub async fn to_file(
    source: &Source,
    dest: &Path,
    with_history: bool,
    now_ms: i64,
    mut progress: impl FnMut(u64, u64),
) -> Result<Imported> {
    let channel = source.connect().await?;
    let mut kv = KvClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE);
    let mut watch = WatchClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE);
    let mut lease = LeaseClient::new(channel);

    let current = header_revision(&mut kv).await?;
    let mut file = LogFile::create(dest).await?;
    let mut copy = Copy {
        file: &mut file,
        total: 0,
        progress: &mut progress,
    };
    let compact = if with_history {
        match copy.changes(&mut watch, 2, current).await? {
            None => 0,
            Some(compacted) => {
                copy.keys_at(&mut kv, compacted).await?;
                if let Some(again) = copy.changes(&mut watch, compacted + 1, current).await? {
                    return Err(Error::CompactedMeanwhile(again));
                }
                compacted
            }
        }
    } else {
        copy.keys_at(&mut kv, current).await?;
        current
    };

    let mut imported = Imported {
        rows: file.rows(),
        current_revision: current,
        compact_revision: compact,
        ..Imported::default()
    };
    let mut named = BTreeSet::new();
    for (_, head) in file.live() {
        imported.keys += 1;
        if head.lease != 0 {
            named.insert(head.lease);
        }
    }
    let leases = leases(&mut lease, &named, now_ms).await?;
    imported.leases = leases.len() as u64;
    file.finish(&leases, current, compact).await?;
    Ok(imported)
}

/// The source's current revision.
async fn header_revision(kv: &mut KvClient<Channel>) -> Result<i64> {
    // Each call has its own deadline (none on the channel: it would also end the watch).
    let request = RangeRequest {
        key: vec![0],
        range_end: vec![0],
        count_only: true,
        ..RangeRequest::default()
    };
    let response = call(kv.range(request)).await?;
    Ok(response.header.map_or(1, |h| h.revision))
}

/// Rows on their way into the file.
struct Copy<'a, P: FnMut(u64, u64)> {
    file: &'a mut LogFile,
    /// About how many rows the import will write, as far as known.
    total: u64,
    progress: &'a mut P,
}

impl<P: FnMut(u64, u64)> Copy<'_, P> {
    fn report(&mut self) {
        let done = self.file.rows();
        (self.progress)(done, self.total.max(done));
    }

    /// Every key live at `revision`, each as one row at its mod revision.
    async fn keys_at(&mut self, kv: &mut KvClient<Channel>, revision: i64) -> Result<()> {
        // Keys written at one revision are numbered in key order (the Range's order).
        let mut subs: HashMap<i64, i64> = HashMap::new();
        let mut from = vec![0];
        let mut limit = FIRST_PAGE;
        loop {
            let page = call(kv.range(RangeRequest {
                key: from,
                range_end: vec![0],
                revision,
                limit,
                ..RangeRequest::default()
            }))
            .await?;
            if self.total == 0 {
                self.total = page.count.max(0) as u64;
            }
            let Some(last) = page.kvs.last() else { break };
            let mut next = last.key.clone();
            next.push(0);
            let bytes: usize = page
                .kvs
                .iter()
                .map(|kv| kv.key.len() + kv.value.len())
                .sum();
            let per_key = (bytes / page.kvs.len()).max(1);
            limit = ((PAGE_BYTES / per_key) as i64).clamp(1, MAX_PAGE);
            for kv in page.kvs {
                let sub = subs.entry(kv.mod_revision).or_insert(0);
                let change = put(kv, *sub);
                *sub += 1;
                self.file.push(change).await?;
            }
            self.report();
            if !page.more {
                break;
            }
            from = next;
        }
        Ok(())
    }

    /// Every change in `[from, to]`, from a watch; `Some(C)` instead if the source compacted
    /// its history at C ≥ `from` (then nothing was copied).
    async fn changes(
        &mut self,
        watch: &mut WatchClient<Channel>,
        from: i64,
        to: i64,
    ) -> Result<Option<i64>> {
        if from > to {
            return Ok(None);
        }
        self.total += (to - from + 1) as u64;
        let (requests, mut responses) = watch_all(watch, from).await?;
        let (mut revision, mut sub) = (0, 0);
        loop {
            let response: WatchResponse = tokio::time::timeout(WAIT, responses.next())
                .await
                .map_err(|_| Error::Timeout)?
                .ok_or_else(|| Error::WatchEnded("the stream closed".into()))??;
            if response.compact_revision > 0 {
                return Ok(Some(response.compact_revision));
            }
            if response.canceled {
                return Err(Error::WatchEnded(response.cancel_reason));
            }
            for event in response.events {
                let Some(kv) = event.kv else { continue };
                if kv.mod_revision > to {
                    return Ok(None);
                }
                if kv.mod_revision != revision {
                    (revision, sub) = (kv.mod_revision, 0);
                }
                let change = if event.r#type == EventType::Delete as i32 {
                    self.tombstone(kv, sub)
                } else {
                    put(kv, sub)
                };
                sub += 1;
                self.file.push(change).await?;
            }
            self.report();
            if revision >= to {
                drop(requests);
                return Ok(None);
            }
        }
    }

    /// A deletion's row: the key's create revision and last version come from its rows so far.
    fn tombstone(&self, kv: KeyValue, sub: i64) -> Change {
        let head = self.file.head(&kv.key).filter(|h| !h.deleted);
        Change {
            revision: kv.mod_revision,
            sub,
            created: false,
            deleted: true,
            create_revision: head.map_or(0, |h| h.create_revision),
            version: head.map_or(0, |h| h.version),
            lease: 0,
            value: Vec::new(),
            key: kv.key,
        }
    }
}

/// A put's row, as etcd reports the key after it.
fn put(kv: KeyValue, sub: i64) -> Change {
    Change {
        revision: kv.mod_revision,
        sub,
        created: kv.version == 1,
        deleted: false,
        create_revision: kv.create_revision,
        version: kv.version,
        lease: kv.lease,
        value: kv.value,
        key: kv.key,
    }
}

/// The source's leases with their granted TTL and remaining time, plus an expired stand-in for
/// each lease in `named` the source no longer has.
async fn leases(
    client: &mut LeaseClient<Channel>,
    named: &BTreeSet<i64>,
    now_ms: i64,
) -> Result<Vec<LeaseRow>> {
    let listed = etcd_leases(client).await?;
    let mut rows = Vec::with_capacity(listed.len());
    for id in listed {
        let ttl = time_to_live(client, id).await?;
        // -1: it expired since it was listed.
        let remaining = ttl.ttl.max(0);
        rows.push(LeaseRow {
            id,
            ttl: ttl.granted_ttl.max(1),
            expires_at: now_ms.saturating_add(remaining.saturating_mul(1000)),
        });
    }
    for id in named {
        if !rows.iter().any(|row| row.id == *id) {
            rows.push(LeaseRow {
                id: *id,
                ttl: 1,
                expires_at: now_ms,
            });
        }
    }
    Ok(rows)
}

/// What `follow` applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Followed {
    /// Revisions applied.
    pub revisions: u64,
    /// The store's revision when following stopped: etcd's at that moment.
    pub revision: i64,
}

/// How often the store's copies of etcd's leases are renewed while following: no expiry runs
/// in the tool, but a lease whose deadline passed could not be renewed at the cut-over.
const LEASE_REFRESH: Duration = Duration::from_secs(1);

/// Keeps applying the source's changes after revision `after` (the revision an import stopped
/// at) to `store`, one txn per etcd revision, so the store's revisions stay etcd's; leases the
/// changes name are granted with etcd's id and TTL, and the store's copies of leases etcd still
/// has are renewed. When `stop` fires it catches up with etcd's revision at that moment, revokes
/// the leases etcd no longer has (their keys' deletions have come through the watch) and returns.
///
/// # Errors
/// The source fails, or the store takes a revision that is not etcd's (something else writes
/// to it), or refuses a change.
pub async fn follow(
    source: &Source,
    store: &crate::mvcc::Store,
    lessor: &crate::lease::Lessor,
    after: i64,
    stop: tokio_util::sync::CancellationToken,
    mut progress: impl FnMut(i64),
) -> Result<Followed> {
    let channel = source.connect().await?;
    let mut kv = KvClient::new(channel.clone());
    let mut watch = WatchClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE);
    let mut lease = LeaseClient::new(channel);
    let (requests, mut responses) = watch_all(&mut watch, after + 1).await?;
    let mut known: BTreeSet<i64> = store
        .leases()
        .await
        .map_err(store_error)?
        .value
        .iter()
        .map(|l| l.id)
        .collect();
    let mut followed = Followed {
        revisions: 0,
        revision: after,
    };
    let mut refresh = tokio::time::interval(LEASE_REFRESH);
    // Set once `stop` fires: etcd's revision then, which following must reach before it ends,
    // and the leases etcd held just before (read first: a lease revoked before the list has
    // its keys' deletions at or below that revision).
    let mut last: Option<i64> = None;
    let mut held = BTreeSet::new();
    // While catching up after `stop`, each watch response must come within WAIT.
    let mut deadline = tokio::time::Instant::now();
    while last.is_none_or(|target| followed.revision < target) {
        let response = tokio::select! {
            () = stop.cancelled(), if last.is_none() => {
                held = etcd_leases(&mut lease).await?;
                last = Some(header_revision(&mut kv).await?);
                deadline = tokio::time::Instant::now() + WAIT;
                continue;
            }
            () = tokio::time::sleep_until(deadline), if last.is_some() => {
                return Err(Error::Timeout);
            }
            _ = refresh.tick() => {
                let now_held = etcd_leases(&mut lease).await?;
                for id in known.intersection(&now_held) {
                    lessor.keep_alive(*id).await.map_err(store_error)?;
                }
                continue;
            }
            // No deadline before `stop`: a source nobody writes to sends nothing, rightly.
            response = responses.next() => response,
        };
        let response: WatchResponse =
            response.ok_or_else(|| Error::WatchEnded("the stream closed".into()))??;
        deadline = tokio::time::Instant::now() + WAIT;
        if response.canceled || response.compact_revision > 0 {
            return Err(Error::WatchEnded(response.cancel_reason));
        }
        for group in response
            .events
            .chunk_by(|a, b| revision_of(a) == revision_of(b))
        {
            let revision = revision_of(&group[0]);
            let mut ops = Vec::with_capacity(group.len());
            for event in group {
                let Some(kv) = &event.kv else { continue };
                if event.r#type == EventType::Delete as i32 {
                    ops.push(Op::Delete(DeleteRequest {
                        range: KeyRange::from_etcd(kv.key.clone(), Vec::new()),
                        prev_kv: false,
                    }));
                    continue;
                }
                if kv.lease != 0 && known.insert(kv.lease) {
                    grant_like_etcd(&mut lease, lessor, kv.lease).await?;
                }
                ops.push(Op::Put(PutRequest {
                    key: kv.key.clone(),
                    value: Some(kv.value.clone()),
                    lease: Some(kv.lease),
                    prev_kv: false,
                }));
            }
            let applied = store
                .txn(TxnRequest {
                    compares: Vec::new(),
                    success: ops,
                    failure: Vec::new(),
                })
                .await
                .map_err(store_error)?;
            if applied.revision != revision {
                return Err(Error::Diverged {
                    etcd: revision,
                    store: applied.revision,
                });
            }
            followed.revision = revision;
            followed.revisions += 1;
        }
        progress(followed.revision);
    }
    drop(requests);
    // Caught up: the keys of the leases etcd no longer holds are gone already, so revoking the
    // copies writes no revision.
    revoke_gone(lessor, &mut known, &held).await?;
    Ok(followed)
}

/// A watch of the whole keyspace from revision `from`. It lasts as long as the returned sender
/// is kept: dropping it closes the request stream, which ends the watch.
async fn watch_all(
    watch: &mut WatchClient<Channel>,
    from: i64,
) -> Result<(mpsc::Sender<WatchRequest>, tonic::Streaming<WatchResponse>)> {
    let (requests, outgoing) = mpsc::channel(1);
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: vec![0],
            range_end: vec![0],
            start_revision: from,
            ..WatchCreateRequest::default()
        })),
    };
    requests
        .send(create)
        .await
        .map_err(|_| Error::WatchEnded("the request stream closed".into()))?;
    let responses = call(watch.watch(ReceiverStream::new(outgoing))).await?;
    Ok((requests, responses))
}

fn revision_of(event: &crate::pb::mvccpb::Event) -> i64 {
    event.kv.as_ref().map_or(0, |kv| kv.mod_revision)
}

pub(crate) fn store_error(e: crate::mvcc::Error) -> Error {
    Error::Store(e.to_string())
}

/// One call to etcd, bounded by [`WAIT`]: its answer.
pub(crate) async fn call<T>(
    request: impl Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T> {
    Ok(tokio::time::timeout(WAIT, request)
        .await
        .map_err(|_| Error::Timeout)??
        .into_inner())
}

/// The ids of the leases the source holds now.
async fn etcd_leases(client: &mut LeaseClient<Channel>) -> Result<BTreeSet<i64>> {
    let listed = call(client.lease_leases(LeaseLeasesRequest {})).await?;
    Ok(listed.leases.into_iter().map(|l| l.id).collect())
}

/// A lease's granted and remaining TTL, as etcd reports them.
async fn time_to_live(
    client: &mut LeaseClient<Channel>,
    id: i64,
) -> Result<crate::pb::etcdserverpb::LeaseTimeToLiveResponse> {
    call(client.lease_time_to_live(LeaseTimeToLiveRequest { id, keys: false })).await
}

/// Grants lease `id` in the store with the TTL etcd granted it (1 s if etcd no longer has it:
/// its keys' deletions follow in the watch).
async fn grant_like_etcd(
    client: &mut LeaseClient<Channel>,
    lessor: &crate::lease::Lessor,
    id: i64,
) -> Result<()> {
    let ttl = time_to_live(client, id).await?;
    match lessor.grant(id, ttl.granted_ttl.max(1)).await {
        Ok(_) | Err(crate::mvcc::Error::LeaseExists) => Ok(()),
        Err(e) => Err(store_error(e)),
    }
}

/// Revokes the store's copies of leases etcd no longer holds.
async fn revoke_gone(
    lessor: &crate::lease::Lessor,
    known: &mut BTreeSet<i64>,
    held: &BTreeSet<i64>,
) -> Result<()> {
    let gone: Vec<i64> = known.difference(held).copied().collect();
    for id in gone {
        match lessor.revoke(id).await {
            Ok(_) | Err(crate::mvcc::Error::LeaseNotFound) => {}
            Err(e) => return Err(store_error(e)),
        }
        known.remove(&id);
    }
    Ok(())
}
