//! Gathers a connection's writes until the runtime has nothing else ready to run, then sends them
//! in one system call.
//!
//! # Why
//! `h2` flushes the socket at the end of every poll of its connection task, and it must flush
//! before it buffers a second DATA frame of 256 bytes or more, so a response to a get usually
//! leaves in a `writev` of its own. On a loopback or LAN connection that call is most of a
//! small request's cost: the sender's kernel also runs the receiver's TCP stack, and every
//! segment wakes the reader. With many streams on one connection, the responses that become
//! ready in one pass of the runtime's queue can share one call, the way grpc-go's writer only
//! flushes once it has nothing left to send.
//!
//! # How
//! [`Coalesce`] wraps the accepted connection under the HTTP/2 server:
//! - Writes are copied into a buffer of up to [`GATHER`] bytes; one that would overflow it
//!   sends what is buffered first, and one of [`GATHER`] bytes or more then goes straight to
//!   the socket, uncopied.
//! - A flush with less than [`LARGE`] buffered sends at once when nothing would be gained by
//!   waiting: no request on the listener is being handled ([`InFlight`], counted by a tower
//!   layer from the moment the server accepts a request until its handler returns the
//!   response), so no other response is coming and a lone client should not pay for a pass of
//!   the runtime.
//! - Nor does a flush send at once in the middle of a response: when the last HTTP/2 frame
//!   written is a stream's HEADERS or DATA frame that does not end the stream ([`FrameTail`]).
//!   h2 flushes before it buffers a DATA frame of 256 bytes or more, and a unary gRPC answer
//!   is HEADERS, a DATA frame and the trailers: with no other request in hand, a get's answer
//!   left in two sends, its trailers (10 bytes) in the second, one more system call and one
//!   more wake-up of the client per request.
//! - A flush with [`LARGE`] bytes or more buffered (a large response under way: h2 writes it
//!   as DATA frames of 16 KiB, the largest most clients accept, and flushes after each) sends
//!   only once [`GATHER`] bytes are buffered. A page of 500 keys thus leaves in sends of 64 KiB
//!   instead of 16 KiB: a quarter of the system calls and segments, on both ends (copying the
//!   frames costs less than the calls it saves).
//! - A flush that holds back does not write: the first one defers a wake of the connection's
//!   task to the runtime's next pass (`tokio::task::yield_now`'s mechanism: deferred wakes run
//!   once the worker has drained its queue, or every few dozen tasks) and reports the flush
//!   done.
//!   Stream tasks that run meanwhile add their responses to the same buffer.
//! - Once that wake has fired, the next touch of the connection (a read, a write or a flush;
//!   the woken task always reads) sends everything buffered.
//!
//! # Guarantees
//! - Bytes leave in the order they were written, none is dropped, and buffered bytes never
//!   wait for another client's request: the deferred wake comes on its own.
//! - A shutdown sends everything buffered first.
//! - At most [`GATHER`] bytes are held per connection, and a write that finds the buffer
//!   full waits for the socket, so a slow reader still pushes back on the server.
//! - Outside a runtime worker the wake is not deferred, and each flush writes at once.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// Requests a listener has accepted and not yet answered (their response headers).
#[derive(Clone, Debug, Default)]
pub struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    /// Wraps a server's service so that it counts its requests here.
    pub fn layer(&self) -> InFlightLayer {
        InFlightLayer(self.clone())
    }

    fn any(&self) -> bool {
        self.0.load(Ordering::Relaxed) > 0
    }

    fn enter(&self) -> Entered {
        self.0.fetch_add(1, Ordering::Relaxed);
        Entered(self.clone())
    }
}

/// One counted request; leaves the count when dropped.
struct Entered(InFlight);

impl Drop for Entered {
    fn drop(&mut self) {
        (self.0).0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// See [`InFlight::layer`].
#[derive(Clone, Debug)]
pub struct InFlightLayer(InFlight);

impl<S> tower_layer::Layer<S> for InFlightLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Counted {
            inner,
            in_flight: self.0.clone(),
        }
    }
}

/// A service whose calls count in an [`InFlight`] until their future finishes or is dropped.
#[derive(Clone, Debug)]
pub struct Counted<S> {
    inner: S,
    in_flight: InFlight,
}

impl<S, R> tower_service::Service<R> for Counted<S>
where
    S: tower_service::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = CountedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        CountedFuture {
            entered: Some(self.in_flight.enter()),
            inner: self.inner.call(request),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`Counted`].
    pub struct CountedFuture<F> {
        #[pin]
        inner: F,
        entered: Option<Entered>,
    }
}

impl<F: Future> Future for CountedFuture<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let output = ready!(this.inner.poll(cx));
        this.entered.take();
        Poll::Ready(output)
    }
}

/// From this much buffered on, a flush means a large response is under way: it waits for
/// [`GATHER`] bytes instead of sending.
pub const LARGE: usize = 16 * 1024;

/// The most bytes gathered into one send: one loopback segment's worth.
pub const GATHER: usize = 64 * 1024;

/// A connection whose writes are gathered into one send per pass of the runtime.
#[derive(Debug)]
pub struct Coalesce<S> {
    inner: S,
    buf: Vec<u8>,
    /// Bytes of `buf` already sent.
    sent: usize,
    /// The deferred wake of the current gathering, until the buffer is sent.
    pending: Option<Arc<DeferredWake>>,
    in_flight: InFlight,
    tail: FrameTail,
}

impl<S> Coalesce<S> {
    pub fn new(inner: S, in_flight: InFlight) -> Self {
        Coalesce {
            inner,
            buf: Vec::new(),
            sent: 0,
            pending: None,
            in_flight,
            tail: FrameTail::default(),
        }
    }

    fn buffered(&self) -> usize {
        self.buf.len() - self.sent
    }
}

/// Follows the HTTP/2 frames a connection writes, from their 9-byte headers, to tell whether the
/// last one leaves a response unfinished: a HEADERS or DATA frame without END_STREAM. Bytes
/// that start like an HTTP/1 response (`HTTP/`) are not followed.
#[derive(Debug, Default)]
struct FrameTail {
    /// Payload bytes of the current frame still to come.
    payload_left: usize,
    /// A frame header split across writes, and how much of it has come.
    head: [u8; FRAME_HEAD],
    head_len: usize,
    /// The last frame header seen was a HEADERS or DATA frame without END_STREAM.
    open: bool,
    /// What is written is not HTTP/2 frames.
    off: bool,
    /// Bytes have been written: the first told whether they are frames.
    started: bool,
}

/// An HTTP/2 frame header's length.
const FRAME_HEAD: usize = 9;

impl FrameTail {
    /// Follows the first `written` bytes of `bufs`, the part of a vectored write that was taken.
    fn observe_written(&mut self, bufs: &[io::IoSlice<'_>], mut written: usize) {
        for b in bufs {
            let part = &b[..written.min(b.len())];
            self.observe(part);
            written -= part.len();
        }
    }

    fn observe(&mut self, mut bytes: &[u8]) {
        if !self.started && !bytes.is_empty() {
            self.started = true;
            self.off = bytes[0] == b'H';
        }
        while !self.off && !bytes.is_empty() {
            if self.payload_left > 0 {
                let skip = self.payload_left.min(bytes.len());
                self.payload_left -= skip;
                bytes = &bytes[skip..];
                continue;
            }
            let take = (FRAME_HEAD - self.head_len).min(bytes.len());
            self.head[self.head_len..self.head_len + take].copy_from_slice(&bytes[..take]);
            self.head_len += take;
            bytes = &bytes[take..];
            if self.head_len < FRAME_HEAD {
                break;
            }
            self.head_len = 0;
            let [l0, l1, l2, kind, flags, ..] = self.head;
            self.payload_left = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
            const DATA: u8 = 0x0;
            const HEADERS: u8 = 0x1;
            const RST_STREAM: u8 = 0x3;
            const END_STREAM: u8 = 0x1;
            match kind {
                DATA | HEADERS => self.open = flags & END_STREAM == 0,
                RST_STREAM => self.open = false,
                _ => {}
            }
        }
    }
}

/// Wakes the connection's task and records that it did.
#[derive(Debug)]
struct DeferredWake {
    fired: AtomicBool,
    task: Waker,
}

impl Wake for DeferredWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        self.task.wake_by_ref();
    }
}

impl<S: AsyncWrite + Unpin> Coalesce<S> {
    /// Sends everything buffered.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.buf.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.buf.clear();
        self.sent = 0;
        self.pending = None;
        Poll::Ready(Ok(()))
    }

    /// Sends the buffer if the runtime has had its pass since it was gathered.
    fn poll_send_due(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &self.pending {
            Some(wake) if wake.fired.load(Ordering::Acquire) => self.poll_send(cx),
            _ => Poll::Ready(Ok(())),
        }
    }

    /// Arranges for the buffer to be sent after the runtime's next pass.
    fn defer_send(&mut self, cx: &mut Context<'_>) {
        if self.pending.is_some() {
            return;
        }
        let wake = Arc::new(DeferredWake {
            fired: AtomicBool::new(false),
            task: cx.waker().clone(),
        });
        let waker = Waker::from(wake.clone());
        let mut yielding = std::pin::pin!(tokio::task::yield_now());
        // The first poll only hands the waker to the runtime's deferred list.
        let _ = yielding.as_mut().poll(&mut Context::from_waker(&waker));
        self.pending = Some(wake);
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Coalesce<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // A full socket only postpones the send; a failed one is reported by the next write.
        let _ = this.poll_send_due(cx);
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesce<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_send_due(cx))?;
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if this.buffered() + len > GATHER {
            ready!(this.poll_send(cx))?;
            if len >= GATHER {
                let n = ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, bufs))?;
                this.tail.observe_written(bufs, n);
                return Poll::Ready(Ok(n));
            }
        }
        for b in bufs {
            this.buf.extend_from_slice(b);
        }
        this.tail.observe_written(bufs, len);
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send_due(cx))?;
        if this.buffered() > 0 {
            let hold = if this.buffered() < LARGE {
                this.in_flight.any() || this.tail.open
            } else {
                this.buffered() < GATHER
            };
            if hold {
                this.defer_send(cx);
                return Poll::Ready(Ok(()));
            }
            ready!(this.poll_send(cx))?;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for Coalesce<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A socket stand-in that records each write call; reads find nothing yet.
    #[derive(Default)]
    struct Recorder {
        sends: Vec<Vec<u8>>,
        shut: bool,
    }

    impl AsyncRead for Recorder {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.get_mut().sends.push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get_mut().shut = true;
            Poll::Ready(Ok(()))
        }
    }

    /// A count with one request being handled, and its entry (keep it alive).
    fn busy() -> (InFlight, Entered) {
        let in_flight = InFlight::default();
        let entered = in_flight.enter();
        (in_flight, entered)
    }

    #[tokio::test]
    async fn flushes_in_one_pass_share_one_send_after_it() {
        let (in_flight, _entered) = busy();
        let mut conn = Coalesce::new(Recorder::default(), in_flight);
        for part in [&b"HEADERS"[..], b"DATA", b"TRAILERS"] {
            conn.write_all(part).await.unwrap();
            conn.flush().await.unwrap();
        }
        assert!(
            conn.inner.sends.is_empty(),
            "sent before the runtime's pass"
        );
        tokio::task::yield_now().await;
        conn.flush().await.unwrap();
        assert_eq!(conn.inner.sends, vec![b"HEADERSDATATRAILERS".to_vec()]);

        // The next gathering starts afresh.
        conn.write_all(b"PING").await.unwrap();
        conn.flush().await.unwrap();
        assert_eq!(conn.inner.sends.len(), 1);
        tokio::task::yield_now().await;
        conn.flush().await.unwrap();
        assert_eq!(conn.inner.sends[1], b"PING");
    }

    #[tokio::test]
    async fn the_woken_task_sends_when_it_reads() {
        let (in_flight, _entered) = busy();
        let mut conn = Coalesce::new(Recorder::default(), in_flight);
        conn.write_all(b"response").await.unwrap();
        conn.flush().await.unwrap();
        tokio::task::yield_now().await;
        let mut buf = [0u8; 16];
        let read = std::future::poll_fn(|cx| {
            let mut rb = ReadBuf::new(&mut buf);
            Poll::Ready(Pin::new(&mut conn).poll_read(cx, &mut rb).is_pending())
        })
        .await;
        assert!(read, "nothing to read");
        assert_eq!(conn.inner.sends, vec![b"response".to_vec()]);
    }

    #[tokio::test]
    async fn shutdown_sends_what_is_buffered() {
        let (in_flight, _entered) = busy();
        let mut conn = Coalesce::new(Recorder::default(), in_flight);
        conn.write_all(b"GOAWAY").await.unwrap();
        conn.flush().await.unwrap();
        conn.shutdown().await.unwrap();
        assert_eq!(conn.inner.sends, vec![b"GOAWAY".to_vec()]);
        assert!(conn.inner.shut);
    }

    #[tokio::test]
    async fn a_reader_that_does_not_read_holds_the_writer_back() {
        let (server, mut client) = tokio::io::duplex(1024);
        let (in_flight, _entered) = busy();
        let mut conn = Coalesce::new(server, in_flight);
        let chunk = vec![7u8; 1000];
        let mut accepted = 0;
        let stalled = std::future::poll_fn(|cx| {
            loop {
                match Pin::new(&mut conn).poll_write(cx, &chunk) {
                    Poll::Ready(Ok(n)) => accepted += n,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Ready(Ok(())),
                }
                if accepted > 16 * LARGE {
                    return Poll::Ready(Ok(()));
                }
            }
        })
        .await;
        stalled.unwrap();
        assert!(
            accepted <= GATHER + 1024,
            "took {accepted} bytes with the reader stalled"
        );

        // Once the reader reads, everything taken arrives, in order.
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.map(|_| got)
        });
        conn.shutdown().await.unwrap();
        drop(conn);
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), reader)
            .await
            .expect("the reader finished")
            .unwrap()
            .unwrap();
        assert_eq!(got.len(), accepted);
        assert!(got.iter().all(|&b| b == 7));
    }

    /// An HTTP/2 frame header for a payload of `len` bytes.
    fn frame_head(len: u8, kind: u8, flags: u8, stream: u8) -> Vec<u8> {
        vec![0, 0, len, kind, flags, 0, 0, 0, stream]
    }

    #[tokio::test]
    async fn a_flush_in_the_middle_of_a_response_waits_for_its_end() {
        // Nothing in flight: only the frames can hold the flush back.
        let mut conn = Coalesce::new(Recorder::default(), InFlight::default());
        // As h2 writes a unary answer: HEADERS, then a DATA frame, flushing before it buffers
        // another (here with the DATA frame's header split over two writes).
        let headers = [frame_head(1, 0x1, 0x4, 1), vec![0x88]].concat();
        let data = [frame_head(5, 0x0, 0x0, 1), b"hello".to_vec()].concat();
        conn.write_all(&headers).await.unwrap();
        conn.write_all(&data[..4]).await.unwrap();
        conn.write_all(&data[4..]).await.unwrap();
        conn.flush().await.unwrap();
        assert!(conn.inner.sends.is_empty(), "sent without its trailers");
        // The trailers end the stream: the flush after them sends the whole answer at once.
        let trailers = [frame_head(1, 0x1, 0x5, 1), vec![0xbe]].concat();
        conn.write_all(&trailers).await.unwrap();
        conn.flush().await.unwrap();
        assert_eq!(
            conn.inner.sends,
            vec![[&headers[..], &data, &trailers].concat()]
        );

        // A stream that stays open (a watch's event) is sent after the runtime's pass.
        let event = [frame_head(5, 0x0, 0x0, 3), b"event".to_vec()].concat();
        conn.write_all(&event).await.unwrap();
        conn.flush().await.unwrap();
        assert_eq!(conn.inner.sends.len(), 1);
        tokio::task::yield_now().await;
        conn.flush().await.unwrap();
        assert_eq!(conn.inner.sends[1], event);
    }

    #[tokio::test]
    async fn with_no_request_in_flight_a_flush_sends_at_once() {
        let in_flight = InFlight::default();
        let mut conn = Coalesce::new(Recorder::default(), in_flight.clone());
        conn.write_all(b"watch event").await.unwrap();
        conn.flush().await.unwrap();
        assert_eq!(conn.inner.sends, vec![b"watch event".to_vec()]);

        // A request being handled makes the next flush wait for the runtime's pass.
        let entered = in_flight.enter();
        conn.write_all(b"response").await.unwrap();
        conn.flush().await.unwrap();
        assert_eq!(conn.inner.sends.len(), 1);
        drop(entered);
        tokio::task::yield_now().await;
        conn.flush().await.unwrap();
        assert_eq!(conn.inner.sends[1], b"response");
    }

    /// A counted service whose first call waits for `release`; later calls answer at once.
    fn first_call_waits(
        in_flight: &InFlight,
        release: tokio::sync::oneshot::Receiver<()>,
    ) -> impl tower_service::Service<
        (),
        Response = (),
        Error = std::convert::Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static {
        use tower::Layer;
        let release = Arc::new(std::sync::Mutex::new(Some(release)));
        in_flight.layer().layer(tower::service_fn(move |_: ()| {
            let release = release.lock().unwrap().take();
            async move {
                if let Some(release) = release {
                    let _ = release.await;
                }
                Ok(())
            }
        }))
    }

    #[tokio::test]
    async fn a_request_counts_until_its_response_is_ready() {
        use tower::ServiceExt;
        let in_flight = InFlight::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let service = first_call_waits(&in_flight, rx);
        let slow = tokio::spawn(service.clone().oneshot(()));
        tokio::task::yield_now().await;
        assert!(in_flight.any(), "the waiting request is counted");
        service.clone().oneshot(()).await.unwrap();
        assert!(in_flight.any(), "another request's answer does not end it");
        tx.send(()).unwrap();
        slow.await.unwrap().unwrap();
        assert!(!in_flight.any());

        // A request dropped unanswered (the client went away) leaves the count too.
        let (_tx, rx) = tokio::sync::oneshot::channel::<()>();
        let service = first_call_waits(&in_flight, rx);
        let mut call = Box::pin(service.oneshot(()));
        assert!(std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx).is_pending())).await);
        assert!(in_flight.any());
        drop(call);
        assert!(!in_flight.any());
    }

    #[tokio::test]
    async fn a_large_response_leaves_in_sends_of_gather_bytes() {
        let (in_flight, _entered) = busy();
        let mut conn = Coalesce::new(Recorder::default(), in_flight);
        // As h2 writes a large response: its headers, then DATA frames of 16 KiB and a 9-byte
        // head, each followed by a flush.
        let mut written = b"HEADERS".to_vec();
        conn.write_all(b"HEADERS").await.unwrap();
        conn.flush().await.unwrap();
        for i in 0..10u8 {
            let frame = vec![i; LARGE + 9];
            conn.write_all(&frame).await.unwrap();
            conn.flush().await.unwrap();
            written.extend_from_slice(&frame);
        }
        let sends = conn.inner.sends.len();
        assert!((2..=3).contains(&sends), "ten frames left in {sends} sends");
        assert!(conn.inner.sends.iter().all(|send| send.len() <= GATHER));
        // The rest waits for the runtime's pass, then leaves in one send.
        tokio::task::yield_now().await;
        conn.flush().await.unwrap();
        assert_eq!(conn.inner.sends.len(), sends + 1);
        assert_eq!(conn.inner.sends.concat(), written);

        // A write of a gathering's worth or more is not copied: it leaves as it is.
        let big = vec![9u8; GATHER];
        conn.write_all(b"HEAD").await.unwrap();
        conn.write_all(&big).await.unwrap();
        assert_eq!(conn.inner.sends[sends + 1], b"HEAD");
        assert_eq!(conn.inner.sends[sends + 2], big);
    }
}
