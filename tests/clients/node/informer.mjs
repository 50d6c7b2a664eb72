// informer.mjs: @kubernetes/client-node's makeInformer on pods, every event as one JSON line.
//
// A test program for watchproxy (tests/e2e/test_rust_node_clients.py). It uses the informer the
// way the library's README does: list + watch via makeInformer, handlers for add/update/delete,
// and on 'error' a restart after a delay (the informer stops itself on any error but a 410).
//
//   node informer.mjs [--namespace NS] [--duration SECONDS] [--restart-delay SECONDS]
//
// Reads KUBECONFIG like any client-node program. Output, one line per event:
//   {"type":"add","namespace":"default","name":"p1","resourceVersion":"12"}
//   {"type":"ERROR","message":"..."}
//   {"type":"READY","resourceVersion":"11"}   once, after the first list and watch started
// Exits with status 0 on SIGTERM, SIGINT or after --duration, printing {"type":"EXIT"} last.

import * as k8s from '@kubernetes/client-node';
import { writeSync } from 'node:fs';

function parseArgs(argv) {
  const args = { namespace: 'default', duration: null, restartDelay: 1.0 };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    if (flag === '--namespace') args.namespace = value;
    else if (flag === '--duration') args.duration = Number(value);
    else if (flag === '--restart-delay') args.restartDelay = Number(value);
    else throw new Error(`unknown argument ${flag}`);
  }
  return args;
}

// writeSync: the line is out (and visible to a reader) before the next event is handled, and
// nothing is left in a buffer when the process exits.
function emit(line) {
  writeSync(1, JSON.stringify(line) + '\n');
}

function objectLine(type, obj) {
  const meta = obj?.metadata ?? {};
  return {
    type,
    namespace: meta.namespace ?? null,
    name: meta.name ?? null,
    resourceVersion: meta.resourceVersion ?? null,
  };
}

function main() {
  let args;
  try {
    args = parseArgs(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`informer: ${err.message}\n`);
    process.exit(2);
  }
  const exit = () => {
    emit({ type: 'EXIT' });
    process.exit(0);
  };
  process.on('SIGTERM', exit);
  process.on('SIGINT', exit);
  if (args.duration !== null) setTimeout(exit, args.duration * 1000);

  const kc = new k8s.KubeConfig();
  kc.loadFromDefault();
  const core = kc.makeApiClient(k8s.CoreV1Api);
  const informer = k8s.makeInformer(kc, `/api/v1/namespaces/${args.namespace}/pods`, () =>
    core.listNamespacedPod({ namespace: args.namespace }),
  );
  informer.on('add', (obj) => emit(objectLine('add', obj)));
  informer.on('update', (obj) => emit(objectLine('update', obj)));
  informer.on('delete', (obj) => emit(objectLine('delete', obj)));

  let ready = false;
  const start = async () => {
    await informer.start();
    // start() returns once the list is done and the watch request has its response, or after
    // the error handler ran; only the former makes the informer ready.
    if (!ready && informer.latestResourceVersion()) {
      ready = true;
      emit({ type: 'READY', resourceVersion: informer.latestResourceVersion() });
    }
  };
  informer.on('error', (err) => {
    emit({ type: 'ERROR', message: String(err?.message ?? err) });
    setTimeout(() => void start(), args.restartDelay * 1000);
  });
  void start();
}

main();
