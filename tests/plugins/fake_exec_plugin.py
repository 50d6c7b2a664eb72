"""A kubeconfig exec plugin for the tests, driven by files in $FAKE_PLUGIN_DIR.

``answers.json`` is a list; run n answers with entry n (the last one once the list is used up):
``{"token": str, "cert": path, "key": path, "expires_in": seconds, "exit": code, "raw": text,
"apiVersion": str}``. Every run appends what it was given to ``runs.jsonl``.
"""

import datetime
import json
import os
import sys


def main() -> int:
    state = os.environ["FAKE_PLUGIN_DIR"]
    runs_path = os.path.join(state, "runs.jsonl")
    with open(os.path.join(state, "answers.json"), encoding="utf-8") as handle:
        answers = json.load(handle)
    try:
        with open(runs_path, encoding="utf-8") as handle:
            run = sum(1 for _ in handle)
    except FileNotFoundError:
        run = 0
    info = json.loads(os.environ.get("KUBERNETES_EXEC_INFO", "null"))
    with open(runs_path, "a", encoding="utf-8") as handle:
        record = {
            "argv": sys.argv[1:],
            "exec_info": info,
            "mark": os.environ.get("FAKE_PLUGIN_MARK"),
            "stdin_is_devnull": os.fstat(0).st_rdev == os.stat(os.devnull).st_rdev,
        }
        handle.write(json.dumps(record) + "\n")
    answer = answers[min(run, len(answers) - 1)]
    if "raw" in answer:
        sys.stdout.write(answer["raw"])
    if "exit" in answer:
        print("fake plugin: failing on purpose", file=sys.stderr)
        return int(answer["exit"])
    if "raw" in answer:
        return 0
    status = {}
    if "token" in answer:
        status["token"] = answer["token"]
    if "cert" in answer:
        with open(answer["cert"], encoding="ascii") as handle:
            status["clientCertificateData"] = handle.read()
        with open(answer["key"], encoding="ascii") as handle:
            status["clientKeyData"] = handle.read()
    if answer.get("expires_in") is not None:
        at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=answer["expires_in"])
        status["expirationTimestamp"] = at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    api_version = answer.get("apiVersion") or (info or {}).get("apiVersion")
    json.dump({"apiVersion": api_version, "kind": "ExecCredential", "status": status}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
