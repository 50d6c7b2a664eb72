//! kubewatch: kube-rs's `watcher` on pods, every event printed as one JSON line.
//!
//! A test program for watchproxy (tests/e2e/test_rust_node_clients.py, bench/kubers_outage.py).
//! It runs `kube_runtime::watcher` exactly as a kube-rs user would, either with no back-off at
//! all (errors are printed and the stream is polled again at once: the tight reconnect loop of
//! the kube-rs issue "Add backoff to watcher reconnection") or with `.default_backoff()`.
//!
//!     kubewatch --backoff none|default [--namespace NS] [--duration SECONDS] [--watchers N]
//!               [--page-size N] [--list-semantic any|most-recent]
//!               [--initial-list list|streaming] [--gzip on|off]
//!
//! --initial-list streaming makes the watcher start with a watch-list (`sendInitialEvents`)
//! instead of LIST + WATCH. --gzip off sets the kubeconfig's `disable-compression`: no
//! `Accept-Encoding: gzip`, as kube without its gzip feature (on by default: kube's own default).
//! --page-size and --list-semantic set the watcher's `page_size` (500 by default) and
//! `list_semantic`. kube-rs lists with resourceVersion=0 by default (`Any`), which the
//! apiserver answers from its cache whole, page size or not; `most-recent` lists consistently,
//! in pages, as client-go's reflector does.
//!
//! Reads KUBECONFIG like any kube-rs program. Output, one line per watcher event, flushed per line:
//!     {"watcher":0,"type":"Apply","namespace":"default","name":"p1","resourceVersion":"12"}
//!     {"watcher":0,"type":"ERROR","message":"..."}
//! Init and InitDone carry no object, so their namespace/name/resourceVersion are null.
//! Exits with status 0 on SIGTERM, SIGINT or after --duration, printing {"type":"EXIT"} last.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};

#[derive(Clone, Copy, PartialEq)]
enum Backoff {
    None,
    Default,
}

struct Args {
    backoff: Backoff,
    namespace: String,
    duration: Option<Duration>,
    watchers: usize,
    page_size: Option<u32>,
    most_recent: bool,
    streaming_list: bool,
    gzip: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        backoff: Backoff::None,
        namespace: "default".into(),
        duration: None,
        watchers: 1,
        page_size: None,
        most_recent: false,
        streaming_list: false,
        gzip: true,
    };
    let mut backoff_given = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--backoff" => {
                backoff_given = true;
                args.backoff = match value()?.as_str() {
                    "none" => Backoff::None,
                    "default" => Backoff::Default,
                    other => return Err(format!("--backoff must be none or default, not {other}")),
                }
            }
            "--namespace" => args.namespace = value()?,
            "--duration" => {
                let seconds: f64 = value()?.parse().map_err(|e| format!("--duration: {e}"))?;
                args.duration = Some(Duration::from_secs_f64(seconds));
            }
            "--watchers" => {
                args.watchers = value()?.parse().map_err(|e| format!("--watchers: {e}"))?;
            }
            "--list-semantic" => {
                args.most_recent = match value()?.as_str() {
                    "any" => false,
                    "most-recent" => true,
                    other => return Err(format!("--list-semantic must be any or most-recent, not {other}")),
                }
            }
            "--initial-list" => {
                args.streaming_list = match value()?.as_str() {
                    "list" => false,
                    "streaming" => true,
                    other => return Err(format!("--initial-list must be list or streaming, not {other}")),
                };
            }
            "--gzip" => {
                args.gzip = match value()?.as_str() {
                    "on" => true,
                    "off" => false,
                    other => return Err(format!("--gzip must be on or off, not {other}")),
                };
            }
            "--page-size" => {
                args.page_size = Some(value()?.parse().map_err(|e| format!("--page-size: {e}"))?);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if !backoff_given {
        return Err("--backoff none|default is required".into());
    }
    Ok(args)
}

/// One line, written and flushed while holding stdout's lock so lines of concurrent watchers
/// never interleave and a reader sees each event as soon as it happened.
fn emit(line: Value) {
    let mut out = std::io::stdout().lock();
    // A closed stdout means the reader is gone: nothing useful is left to do.
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

fn event_line(watcher: usize, event: &Event<Pod>) -> Value {
    let (kind, pod) = match event {
        Event::Apply(pod) => ("Apply", Some(pod)),
        Event::Delete(pod) => ("Delete", Some(pod)),
        Event::Init => ("Init", None),
        Event::InitApply(pod) => ("InitApply", Some(pod)),
        Event::InitDone => ("InitDone", None),
    };
    json!({
        "watcher": watcher,
        "type": kind,
        "namespace": pod.and_then(|p| p.namespace()),
        "name": pod.map(|p| p.name_any()),
        "resourceVersion": pod.and_then(|p| p.resource_version()),
    })
}

async fn drain<S>(watcher: usize, stream: S)
where
    S: Stream<Item = Result<Event<Pod>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    // Never ends on its own: the watcher recovers from every error when polled again.
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => emit(event_line(watcher, &event)),
            Err(err) => emit(json!({"watcher": watcher, "type": "ERROR", "message": err.to_string()})),
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let mut config = kube::Config::infer().await.map_err(|e| format!("kubeconfig: {e}"))?;
    config.disable_compression = !args.gzip;
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..args.watchers {
        // One client per watcher: separate connections, as separate controllers would have.
        let client = Client::try_from(config.clone()).map_err(|e| format!("client: {e}"))?;
        let api: Api<Pod> = Api::namespaced(client, &args.namespace);
        let mut watch_config = watcher::Config::default();
        if let Some(size) = args.page_size {
            watch_config = watch_config.page_size(size);
        }
        if args.most_recent {
            watch_config = watch_config.list_semantic(watcher::ListSemantic::MostRecent);
        }
        if args.streaming_list {
            watch_config = watch_config.streaming_lists();
        }
        let stream = watcher::watcher(api, watch_config);
        match args.backoff {
            Backoff::None => tasks.spawn(drain(index, stream)),
            Backoff::Default => tasks.spawn(drain(index, stream.default_backoff())),
        };
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("SIGTERM handler: {e}"))?;
    let deadline = async {
        match args.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
        () = deadline => {}
    }
    // Abort, then wait until every watcher task is gone, before returning. `abort_all` only
    // asks: a task in the middle of a poll (printing a burst of events) runs on until it next
    // waits. Returning at once dropped the runtime under that task: the runtime's shutdown
    // dropped its watch connection (hyper: "connection closed before message completed") and
    // kube's `Buffer` worker, and the watcher, polled again, failed at once with "buffer's worker
    // closed unexpectedly" in a loop that never waits, so the abort never landed and the runtime
    // never finished shutting down: hundreds of thousands of ERROR lines until SIGKILL. Joined
    // here, each task meets its abort at its next wait while its client is still whole.
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(msg) => {
            eprintln!("kubewatch: {msg}");
            return ExitCode::from(2);
        }
    };
    let result = run(args).await;
    emit(json!({"type": "EXIT"}));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("kubewatch: {msg}");
            ExitCode::FAILURE
        }
    }
}
