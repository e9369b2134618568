//! The Web Worker half: owns the [`Session`] (scripts, compile caches and
//! the backend) and answers each [`Request`] with a [`Response`].

use crate::protocol::{Request, Response};
use crate::script::Session;
use serde::Serialize;
use std::cell::RefCell;
use wasm_bindgen::prelude::*;
use web_sys::{DedicatedWorkerGlobalScope, MessageEvent};

thread_local! {
    static SESSION: RefCell<Session> = RefCell::new(Session::new());
}

/// Starts answering the page's messages; called by `worker.js` once the
/// module is loaded.
#[wasm_bindgen]
pub fn start_worker() -> Result<(), JsValue> {
    let scope: DedicatedWorkerGlobalScope = js_sys::global().dyn_into()?;
    let reply_scope = scope.clone();
    let on_message = Closure::<dyn Fn(MessageEvent)>::new(move |event: MessageEvent| {
        let response = match serde_wasm_bindgen::from_value::<Request>(event.data()) {
            Ok(Request::Run { id, script }) => Response::Report {
                id,
                report: SESSION.with(|s| s.borrow_mut().run(&script)),
            },
            Ok(Request::Compare { id, script }) => Response::Comparison {
                id,
                rows: SESSION.with(|s| s.borrow_mut().compare(&script)),
            },
            Err(e) => {
                web_sys_console_error(&format!("kiln worker: unreadable request: {e}"));
                return;
            }
        };
        if let Err(e) = post(&reply_scope, &response) {
            web_sys_console_error(&format!("kiln worker: cannot post the report: {e:?}"));
        }
    });
    scope.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    // The handler lives as long as the worker.
    on_message.forget();
    post(
        &scope,
        &Response::Ready {
            backend: "cpu".to_string(),
        },
    )
}

fn post(scope: &DedicatedWorkerGlobalScope, response: &Response) -> Result<(), JsValue> {
    let message = response.serialize(&serde_wasm_bindgen::Serializer::json_compatible())?;
    scope.post_message(&message)
}

fn web_sys_console_error(message: &str) {
    web_sys::console::error_1(&JsValue::from_str(message));
}
