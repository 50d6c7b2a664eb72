"""listload: concurrent LISTs and watches of one collection through the sidecar, each read at its
own pace.

Run inside an app container of a pod with the sidecar (tests/realnode/test_sidecar_memory.py
passes it to ``python3 -c``; the standard library only, since the app image has nothing else):

    python3 listload.py PATH OBJECTS RATE:QUERY [RATE:QUERY ...]

PATH is the collection (``/api/v1/namespaces/NS/configmaps``), OBJECTS how many objects it holds
(a watch, whose query has ``watch=1``, is read until it has delivered them all, then closed);
each RATE:QUERY is one client
that sends ``GET PATH?QUERY`` to the sidecar at 127.0.0.1:8001 at the same moment as the others
and reads the answer at RATE bytes per second (0: as fast as it can), through a socket whose
receive buffer is kept small, so that a slow reader holds little in its kernel buffer and the
rest of its answer waits in the sidecar or upstream. Each client prints one JSON line when done:
its query, the HTTP status, the body's bytes, how many objects named ``NAME_PREFIX*`` it held,
the seconds it took, and the error that ended it, if any.
"""

import http.client
import json
import socket
import sys
import threading
import time

NAME_PREFIX = b'"name":"big-'
PIECE = 64 * 1024
RECEIVE_BUFFER = 128 * 1024


class SmallBufferConnection(http.client.HTTPConnection):
    def connect(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Before connect: the TCP window is negotiated from it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.settimeout(120)
        sock.connect((self.host, self.port))
        self.sock = sock


def read_one(path: str, objects: int, rate: float, query: str, start: threading.Barrier) -> None:
    watch = "watch=1" in query.split("&")
    result = {"query": query, "rate": rate, "status": 0, "bytes": 0, "names": 0, "error": None}
    connection = SmallBufferConnection("127.0.0.1", 8001)
    start.wait()
    began = time.monotonic()
    try:
        connection.request("GET", f"{path}?{query}", headers={"Accept": "application/json"})
        response = connection.getresponse()
        result["status"] = response.status
        carry = b""
        while piece := response.read(PIECE):
            result["bytes"] += len(piece)
            data = carry + piece
            result["names"] += data.count(NAME_PREFIX)
            # A name split across two pieces is counted in the next one.
            carry = data[-(len(NAME_PREFIX) - 1) :]
            if watch and result["names"] >= objects:
                break
            if rate:
                ahead = began + result["bytes"] / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
    except (OSError, http.client.HTTPException) as error:
        result["error"] = f"{type(error).__name__}: {error}"
    finally:
        connection.close()
    result["seconds"] = round(time.monotonic() - began, 2)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def main() -> None:
    path, objects, clients = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    start = threading.Barrier(len(clients))
    threads = []
    for client in clients:
        rate, _, query = client.partition(":")
        thread = threading.Thread(target=read_one, args=(path, objects, float(rate), query, start))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
