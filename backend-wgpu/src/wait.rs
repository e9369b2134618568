//! A one-value channel whose receiver is a future: how a map callback hands
//! its result to `download_async` on every platform (the browser cannot
//! block on a std channel).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
}

/// The sending half.
pub(crate) struct Sender<T>(Arc<Mutex<Slot<T>>>);

/// The receiving half: resolves to the sent value.
pub(crate) struct Receiver<T>(Arc<Mutex<Slot<T>>>);

/// A connected sender and receiver.
pub(crate) fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let slot = Arc::new(Mutex::new(Slot {
        value: None,
        waker: None,
    }));
    (Sender(slot.clone()), Receiver(slot))
}

impl<T> Sender<T> {
    /// Delivers `value` and wakes the receiver.
    pub(crate) fn send(self, value: T) {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        slot.value = Some(value);
        if let Some(waker) = slot.waker.take() {
            waker.wake();
        }
    }
}

impl<T> Future for Receiver<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match slot.value.take() {
            Some(value) => Poll::Ready(value),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
