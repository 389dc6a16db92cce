//! The body of an answer seen through a [`Link`]: watch frames lagged, held, stalled, broken.

use std::{
    collections::VecDeque,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame};
use tokio::time::{Instant, Sleep};

use super::{BoxError, Link};

/// A response body seen through the link: watch frames lagged, held while paused, silent once
/// stalled, cut off when the link breaks.
pub struct FaultBody<B> {
    inner: Option<B>,
    link: Option<Arc<Link>>,
    /// The stream's id and resource, for a watch.
    stream: Option<(u64, String)>,
    /// Frames read from the API, with the instant each may be delivered.
    queue: VecDeque<(Instant, Frame<Bytes>)>,
    inner_done: bool,
    timer: Option<Pin<Box<Sleep>>>,
    changed: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// A whole body made here (a simulated error answer).
    full: Option<Bytes>,
}

impl<B> Drop for FaultBody<B> {
    fn drop(&mut self) {
        if let (Some(link), Some((stream, _))) = (&self.link, &self.stream) {
            link.state.lock().undelivered -= self.queue.len();
            link.close_stream(*stream);
        }
    }
}

// === impl FaultBody ===

impl<B> FaultBody<B> {
    pub(super) fn new(inner: B, link: Arc<Link>, stream: Option<(u64, String)>) -> Self {
        Self {
            inner: Some(inner),
            link: Some(link),
            stream,
            queue: VecDeque::new(),
            inner_done: false,
            timer: None,
            changed: None,
            full: None,
        }
    }

    pub(super) fn full(bytes: Bytes) -> Self {
        Self {
            inner: None,
            link: None,
            stream: None,
            queue: VecDeque::new(),
            inner_done: true,
            timer: None,
            changed: None,
            full: Some(bytes),
        }
    }

    /// Registers for the next change of the link's faults; `true` if one already happened.
    fn link_changed(&mut self, link: &Arc<Link>, cx: &mut Context<'_>) -> bool {
        let changed = self.changed.get_or_insert_with(|| {
            let mut receiver = link.changed.subscribe();
            Box::pin(async move {
                let _ = receiver.changed().await;
            })
        });
        if changed.as_mut().poll(cx).is_ready() {
            self.changed = None;
            return true;
        }
        false
    }
}

impl<B> Body for FaultBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(full) = this.full.take() {
            return Poll::Ready(Some(Ok(Frame::data(full))));
        }
        let (Some(_), Some(link)) = (this.inner.as_ref(), this.link.clone()) else {
            return Poll::Ready(None);
        };
        let Some(stream) = this.stream.as_ref().map(|(id, _)| *id) else {
            // Not a watch: the answer passes as it is.
            let Some(inner) = this.inner.as_mut() else {
                return Poll::Ready(None);
            };
            return Pin::new(inner).poll_frame(cx).map_err(Into::into);
        };
        loop {
            let (paused, stalled, ended, cut, lag) = {
                let state = link.state.lock();
                let resource = this.stream.as_ref().map(|(_, resource)| resource.as_str());
                let lag = match &state.lagging {
                    Some((lagging, lag)) if Some(lagging.as_str()) == resource => state.lag + *lag,
                    _ => state.lag,
                };
                (
                    state.paused || (state.held.is_some() && state.held.as_deref() == resource),
                    stream < state.stalled_below,
                    stream < state.ended_below,
                    state.cut,
                    lag,
                )
            };
            if ended {
                this.inner = None;
                return Poll::Ready(cut.then(|| Err("connection reset (simulated)".into())));
            }
            while !this.inner_done {
                let Some(inner) = this.inner.as_mut() else {
                    return Poll::Ready(None);
                };
                match Pin::new(inner).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        this.queue.push_back((Instant::now() + lag, frame));
                        link.state.lock().undelivered += 1;
                    }
                    Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error.into()))),
                    Poll::Ready(None) => this.inner_done = true,
                    Poll::Pending => break,
                }
            }
            if !(paused || stalled) {
                match this.queue.front() {
                    Some((at, _)) if *at <= Instant::now() => {
                        this.timer = None;
                        let frame = this.queue.pop_front().map(|(_, frame)| Ok(frame));
                        link.state.lock().undelivered -= 1;
                        return Poll::Ready(frame);
                    }
                    Some((at, _)) => {
                        let at = *at;
                        let timer = this
                            .timer
                            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                        if timer.deadline() != at {
                            timer.as_mut().reset(at);
                        }
                        if timer.as_mut().poll(cx).is_ready() {
                            continue;
                        }
                    }
                    None if this.inner_done => return Poll::Ready(None),
                    None => {}
                }
            }
            if this.link_changed(&link, cx) {
                continue;
            }
            return Poll::Pending;
        }
    }
}
