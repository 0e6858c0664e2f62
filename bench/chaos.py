"""Chaos bench: SIGKILL the daemon (and now and then the broker) at random moments under load from every kind
of source, then check that every acknowledged record is in its table exactly once.

Set-up: a moto S3 server (`moto_server`, a subprocess on loopback) holding the topics of a tansu broker
(`--storage-engine s3://tansu/`, as tests/test_kafka_daemon.py does: tansu keeps topics in memory otherwise, and a
broker restart would lose them), and a real daemon (`python -m lakefeed run`, its own session, a fixed HTTP port as
a real producer would use) with two entities (`--entities`):

* `events`, `cdc: append`, and `accounts`, `cdc: upsert` keyed by `uid`. Each takes all three kinds of source at
  once: a push source, a landing folder (`landing/<entity>/data/*.csv`) and a Kafka topic (`chaos_<entity>`,
  `--partitions` partitions). Every record carries a unique `uid` (`p…` pushed, `f…` landed, `k…` produced), `src`
  and a `seq`.

Load, in threads of this process, for as long as the kills go on:

* push: `--push-workers` producers per entity, `--push-rate` requests/s in all, 1..`--push-records` records each,
  every request with an Idempotency-Key, retried with the same key and body until it is answered 202, as a real
  producer does (connection refused or reset while the daemon is down, 503 while it starts, a timeout). A request
  answered 202 is sent again with the same key now and then (`--resend`: the producer lost the answer); it must be
  answered 202 again and stored once. A request still unanswered when the load stops is "unacknowledged": its
  records may be missing, but never twice.
* files: `--file-rate` CSV files/s per entity, 1..`--file-rows` rows each, written under a temporary name and
  renamed into place, whether the daemon is up or not.
* Kafka: `--kafka-rate` messages/s per entity, one batch a second, acks=all. A batch that fails (the broker is down)
  is sent again on a new producer until acknowledged; a failed attempt may still have reached the topic, so the
  truth for Kafka is what the topic holds at the end (read back whole), and every acknowledged message must be in
  it (else the broker lost it, reported apart). For the append entity each (partition, offset) must be in the
  table once too.

Kills (`--kills`): SIGKILL to the daemon's process only, as a crash or the OOM killer does; its intake dies with it
(PR_SET_PDEATHSIG) and its JVM and Python workers follow. Whatever of its processes is still alive
`--leftover-wait` s later is counted (`leftover_processes_after_kill`) and SIGKILLed, as systemd does once the main
process is gone. When each kill aims is `--pattern`, cycled: `R` a random time (uniform in [`--min-interval`,
`--max-interval`] s, seeded by `--seed`) after daemon.ready, `W` as long after the life's first committed batch
(the daemon ingests, but some queries may still be starting and the intake may still answer 503), `S` during
start-up (a random share of the start-up time seen so far). The daemon is started again after 0..`--max-down` s.
In every `--broker-every`-th interval the broker is SIGKILLed too, at a random moment, and started again after
0.5..`--max-broker-down` s, while the daemon runs (or starts).

At the end: the load stops (pending pushes are still retried until acknowledged), the topics are read back, the
run waits until every expected record is in its table, the daemon gets SIGTERM (must exit 0), `python -m lakefeed
verify` must exit 0, and the tables are counted: per entity and source, records expected, found, missing,
duplicated, and never-sent records found. For the upsert entity the changelog must hold one entry per uid (a
replayed batch merged twice would show there, not in the table). The quarantine tables must be empty.

The trigger interval is 0.5 s (`--trigger`), as in the other benches. (Until start-up counted a query busy with
the last life's backlog as started, daemon/ops/runner.py start_streams waited up to 120 s per entity for each query
to be seen waiting; under continuous load it never is: 250 s to daemon.ready with two entities on 2 cores, 20 s
since.)

tansu stores each record batch as an S3 object and lists a partition's objects on every fetch: the producers send a
batch a second, and the topic is read back with a long fetch wait (with 100 ms, tansu answered nothing at all from
a topic of 2,000 batches).

Progress goes to stderr; one JSON object goes to stdout at the end. Exit status 0 when nothing acknowledged was
lost or duplicated, verify passed and the daemon stopped with 0; 1 otherwise. The work folder is kept when the run
fails (logs/daemon-NNN.log: one per life).

    python bench/chaos.py [--kills 50] [--seed 1] [--pattern RRWRS] [--broker-every 10] [--min-interval 1]
                          [--max-interval 20] [--entities events,accounts] [--keep] [--smoke]

`--smoke`: the append entity only, 2 kills (one during start-up, one after the first commit with a broker kill),
light load; three daemon start-ups, so 1 to 3 minutes depending on the machine's other load.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.kafka_broker: the test suite's tansu

import boto3  # noqa: E402
import yaml  # noqa: E402
from _common import (  # noqa: E402  (bench/ is the script folder, so on sys.path)
    BenchError,
    Deadline,
    is_intake,
    kill_group,
    log_events,
    log_tail,
    parse_args,
    publish,
    say,
    workdir,
)
from deltalake import DeltaTable  # noqa: E402
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402
from kafka.admin import NewTopic  # noqa: E402
from kafka.errors import TopicAlreadyExistsError  # noqa: E402

from tests.kafka_broker import Broker, free_port, tansu_binary  # noqa: E402

TOKEN = "chaos-token-not-a-secret"
PUSH = "api"
KAFKA = "topic"
ENTITIES = {"events": {"strategy": "append"}, "accounts": {"strategy": "upsert", "primary_key": ["uid"]}}
REQUEST_TIMEOUT_S = 20.0
FINISH_S = 180.0  # after the load stops: how long a pending push or Kafka batch is still retried
S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1",
          "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
# The append entity only (a daemon with both starts six queries: twice the start-up); kill 1 during start-up, kill 2
# after the life's first commit (the broker's during its interval).
SMOKE = {"kills": 2, "pattern": "SW", "broker_every": 2, "min_interval": 1.0, "max_interval": 4.0,
         "max_down": 1.0, "max_broker_down": 2.0, "tail": 3.0, "entities": "events", "push_rate": 4.0,
         "push_workers": 1, "file_rate": 0.5, "kafka_rate": 20.0, "drain_timeout": 120.0, "timeout": 300.0,
         "reserve": 60.0}
KINDS = {"R": "after ready", "W": "after the first commit", "S": "during start-up"}


# --------------------------------------------------------------------------- servers


class Moto:
    """moto's S3 server as a subprocess on a free loopback port, with the bucket tansu stores its topics in."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        with open(log, "ab") as out:
            self.proc = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1",
                                          "-p", str(self.port)], stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def create_bucket(self, name: str, timeout: float = 60.0) -> None:
        s3 = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="us-east-1")
        give_up = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"moto_server exited with {self.proc.returncode}")
            try:
                s3.create_bucket(Bucket=name)
                return
            except Exception:
                if time.monotonic() > give_up:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                kill_group(self.proc)


class DurableBroker(Broker):
    """tansu with its topics in moto's S3 (tests/test_kafka_daemon.py's DurableBroker), in a session of its own,
    killed with SIGKILL when asked."""

    def __init__(self, log: Path, s3_endpoint: str) -> None:
        super().__init__(log)
        self._env = {**os.environ, **S3_ENV, "AWS_ENDPOINT": s3_endpoint}

    def start(self, timeout: float = 30.0) -> None:
        url = f"tcp://{self.bootstrap}"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([str(tansu_binary()), "broker", "--listener-url", url,
                                          "--advertised-listener-url", url, "--storage-engine", "s3://tansu/"],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=self._env, start_new_session=True)
        self._wait_ready(timeout)

    def kill(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)
            self.proc = None

    def create_topic(self, name: str, partitions: int) -> str:
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            admin.create_topics([NewTopic(name, partitions, 1)])
        except TopicAlreadyExistsError:
            pass
        finally:
            admin.close()
        return name


# --------------------------------------------------------------------------- the daemon


def _proc_stat(pid: int) -> tuple[int, int, str, str, int] | None:
    """(ppid, session id, state, command name, start time) of a process, None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[3]), fields[0], comm, int(fields[19])


def _alive(pid: int, started: int) -> bool:
    """Whether the process that started at `started` still runs (not a later one that got its pid)."""
    stat = _proc_stat(pid)
    return stat is not None and stat[2] not in ("Z", "X") and stat[4] == started


def daemon_processes(pid: int) -> dict[int, tuple[str, int]]:
    """The daemon's processes, pid -> (kind, start time): its session (JVM, Python workers) and its intake, which
    may lead a session of its own (bench/_common.py cpu_of)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _proc_stat(int(entry))
        if stat is None or stat[2] in ("Z", "X"):
            continue
        ppid, sid, _, comm, started = stat
        if sid == pid or (ppid == pid and is_intake(int(entry))):
            out[int(entry)] = ("intake" if is_intake(int(entry)) else comm, started)
    return out


def _kill_left(left: dict[int, tuple[str, int]]) -> None:
    for p, (_, started) in left.items():
        if _alive(p, started):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Daemon:
    """`python -m lakefeed run` in a session of its own; one log file per life (logs/daemon-NNN.log)."""

    def __init__(self, work: Path, config: Path) -> None:
        self.work, self.config = work, config
        (work / "logs").mkdir(exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.all: list[subprocess.Popen] = []  # every life's process, for the clean-up
        self.lives: list[dict[str, Any]] = []
        self.known: dict[int, tuple[str, int]] = {}  # this life's processes seen so far: pid -> (kind, start)
        self.pos = 0  # how far this life's log was read
        self.meant_up = False  # False once we killed or stopped it: its exit is no surprise then

    @property
    def log(self) -> Path:
        return self.work / "logs" / f"daemon-{len(self.lives):03d}.log"

    def start(self) -> None:
        if self.alive():
            raise BenchError("a second daemon was about to start beside a running one")
        self.lives.append({"spawned": time.monotonic(), "events": Counter(), "working_s": None, "ready_s": None,
                           "failures": []})
        self.known, self.pos = {}, 0
        with open(self.log, "wb") as log_file:
            self.proc = subprocess.Popen([sys.executable, "-m", "lakefeed", "run", "--config", str(self.config)],
                                         cwd=self.work, stdin=subprocess.DEVNULL, stdout=log_file,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.all.append(self.proc)
        self.meant_up = True

    def died(self) -> bool:
        """Whether it exited by itself (not by our SIGKILL or SIGTERM)."""
        return self.meant_up and self.proc is not None and self.proc.poll() is not None

    def poll(self) -> dict[str, Any]:
        """Read this life's new log events; the life's record (event counts, when it began working, ...)."""
        life = self.lives[-1]
        if self.log.exists():
            events, self.pos = log_events(self.log, self.pos)
            for e in events:
                life["events"][e["event"]] += 1
                if e["event"] in ("batch.committed", "daemon.ready") and life["working_s"] is None:
                    life["working_s"] = round(self.up_s(), 2)
                if e["event"] == "daemon.ready":
                    life["ready_s"] = round(self.up_s(), 2)
                elif e["event"] in ("entity.failed", "daemon.failed"):
                    life["failures"].append({k: v for k, v in e.items() if k != "level"})
        return life

    def ready(self) -> bool:
        return self.poll()["ready_s"] is not None

    def working(self) -> bool:
        """Whether this life committed a batch or is ready (start-up is over, or far enough along to ingest)."""
        return self.poll()["working_s"] is not None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def up_s(self) -> float:
        return time.monotonic() - self.lives[-1]["spawned"]

    def remember(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.known.update(daemon_processes(self.proc.pid))

    def sigkill(self, leftover_wait: float) -> dict[str, Any]:
        """SIGKILL the daemon's process only; then wait for the rest of it to go, and SIGKILL what stays."""
        assert self.proc is not None
        self.remember()
        life = self.lives[-1]
        self.poll()
        life.update(killed_after_s=round(self.up_s(), 2), ready=life["ready_s"] is not None,
                    batches=life["events"]["batch.committed"])
        pid = self.proc.pid
        self.meant_up = False
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        give_up = time.monotonic() + leftover_wait
        while True:
            left = self._left(pid)
            if not left or time.monotonic() > give_up:
                break
            time.sleep(0.1)
        life["leftovers"] = sorted(kind for kind, _ in left.values())
        _kill_left(left)
        return life

    def _left(self, pid: int) -> dict[int, tuple[str, int]]:
        return {p: v for p, v in {**self.known, **daemon_processes(pid)}.items() if p != pid and _alive(p, v[1])}

    def stop(self, timeout: float) -> int | None:
        """SIGTERM; the exit code, or None if it did not exit in time."""
        assert self.proc is not None
        self.remember()
        self.meant_up = False
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        life = self.poll()
        life.update(stopped_after_s=round(self.up_s(), 2), batches=life["events"]["batch.committed"])
        return code

    def clean_up(self, wait: float = 0.0) -> list[str]:
        """SIGKILL whatever is left of the current life after `wait` s (also after a failure); what was left."""
        if self.proc is None:
            return []
        self.meant_up = False
        self.remember()
        pid = self.proc.pid
        give_up = time.monotonic() + wait
        while self._left(pid) and time.monotonic() < give_up:
            time.sleep(0.1)
        for proc in self.all:  # earlier lives only if still running (a dead one's pid may be anybody's now)
            if proc is self.proc or proc.poll() is None:
                kill_group(proc)
        left = self._left(pid)
        _kill_left(left)
        return sorted(kind for kind, _ in left.values())


def config_doc(entities: list[str], port: int, bootstrap: str, trigger: float) -> dict[str, Any]:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    return {"lake_dir": "lake", "state_dir": "state", "log_level": "INFO",
            "spark": {"master": "local[2]", "trigger_interval_s": trigger},
            "http": {"host": "127.0.0.1", "port": port},
            "entities": [{
                "name": e,
                "source": {"type": "local_dir", "path": f"landing/{e}", "reconcile_interval_s": 2.0},
                "manifest": f"landing/{e}/default.manifest.cdm.json",
                "patterns": [{"name": "flat", "root_location": "data", "glob_pattern": "/*.csv"}],
                "format": {"kind": "csv", "header": True},
                "push": [{"name": PUSH, "tokens_sha256": [digest]}],
                "kafka": [{"name": KAFKA, "bootstrap_servers": bootstrap, "topics": [topic(e)],
                           "starting_offsets": "earliest"}],
                "cdc": ENTITIES[e],
            } for e in entities]}


def topic(entity: str) -> str:
    return f"chaos_{entity}"


# --------------------------------------------------------------------------- load


class Stop:
    """The load's two stops: `soft` (start nothing new, finish what is pending) and `hard` (give up at once)."""

    def __init__(self) -> None:
        self.soft = threading.Event()
        self.hard = threading.Event()


class Worker(threading.Thread):
    def __init__(self, name: str, stop: Stop) -> None:
        super().__init__(name=name, daemon=True)
        self.stop = stop
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
        except BaseException as exc:  # reported by the main loop
            self.error = exc

    def work(self) -> None:
        raise NotImplementedError

    def pace(self, period: float, since: float) -> None:
        """Sleep until `since + period`, or until the load stops."""
        self.stop.soft.wait(max(0.0, since + period - time.monotonic()))


class Pusher(Worker):
    """One closed-loop producer of one entity: a request, retried with its Idempotency-Key until 202."""

    def __init__(self, entity: str, index: int, port: int, period: float, max_records: int, resend: float,
                 seed: int, stop: Stop) -> None:
        super().__init__(f"push-{entity}-{index}", stop)
        self.entity, self.index, self.port, self.period = entity, index, port, period
        self.max_records, self.resend = max_records, resend
        self.rng = random.Random(seed)
        self.acked: list[str] = []  # uids of records acknowledged
        self.unacked: list[str] = []  # uids of the request still unanswered when the load stopped
        self.requests = 0
        self.attempts = 0
        self.statuses: Counter[str] = Counter()
        self.resends = 0
        self.resends_not_duplicate = 0  # a re-sent key answered 202 without "duplicate": true
        self.rejected: list[str] = []  # answers that say the request will never be stored (400, 401, 404, ...)

    def work(self) -> None:
        path = f"/v1/entities/{self.entity}/sources/{PUSH}/records"
        while not self.stop.soft.is_set():
            began = time.monotonic()
            n = self.requests
            self.requests += 1
            key = f"{self.entity}-{self.index}-{n}"
            uids = [f"p{self.index}-{n}-{j}" for j in range(self.rng.randint(1, self.max_records))]
            body = json.dumps([{"uid": u, "src": "push", "seq": n} for u in uids]).encode()
            answer = self.send(path, key, body)
            if answer is None:
                self.unacked.extend(uids)
                return
            if answer is False:
                continue
            self.acked.extend(uids)
            if self.rng.random() < self.resend:  # as if the 202 had been lost on its way
                again = self.send(path, key, body)
                self.resends += 1
                if isinstance(again, dict) and again.get("duplicate") is not True:
                    self.resends_not_duplicate += 1
            self.pace(self.period, began)

    def send(self, path: str, key: str, body: bytes) -> dict | bool | None:
        """Until 202: its answer; False if rejected for good; None if the load stopped first."""
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json", "Idempotency-Key": key}
        finish_by: float | None = None
        while True:
            if self.stop.hard.is_set():
                return None
            if self.stop.soft.is_set():
                finish_by = finish_by or time.monotonic() + FINISH_S
                if time.monotonic() > finish_by:
                    return None
            self.attempts += 1
            wait = 0.3
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S)
            try:
                conn.request("POST", path, body, headers)
                resp = conn.getresponse()
                data = resp.read()
                status = str(resp.status)
                if resp.status == 202:
                    self.statuses[status] += 1
                    return json.loads(data)
                if resp.status in (429, 503) or resp.status >= 500:
                    wait = min(float(resp.getheader("Retry-After") or 0.5), 2.0)
                else:
                    self.statuses[status] += 1
                    self.rejected.append(f"{status}: {data[:300]!r}")
                    return False
            except (OSError, http.client.HTTPException) as exc:
                status = type(exc).__name__
            finally:
                conn.close()
            self.statuses[status] += 1
            self.stop.hard.wait(wait * (0.5 + self.rng.random()))


class Lander(Worker):
    """CSV files into an entity's landing folder, each under a temporary name first, then renamed into place."""

    def __init__(self, entity: str, folder: Path, period: float, max_rows: int, seed: int, stop: Stop) -> None:
        super().__init__(f"files-{entity}", stop)
        self.folder, self.period, self.max_rows = folder, period, max_rows
        self.rng = random.Random(seed)
        self.landed: list[str] = []
        self.files = 0

    def work(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        while not self.stop.soft.is_set():
            began = time.monotonic()
            n = self.files
            uids = [f"f{n}-{j}" for j in range(self.rng.randint(1, self.max_rows))]
            path = self.folder / f"f{n:06d}.csv"
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text("uid,src,seq\n" + "".join(f"{u},file,{n}\n" for u in uids), encoding="utf-8")
            os.replace(tmp, path)
            self.files += 1
            self.landed.extend(uids)
            self.pace(self.period, began)


class Producer(Worker):
    """Kafka messages to an entity's topic, a batch a second; a batch not acknowledged whole is sent again (what
    failed of it) on a new producer until it is. (tansu stores each record batch as an S3 object and its fetches
    get slower with their number: fewer, larger batches keep the topic readable at the end.)"""

    def __init__(self, entity: str, bootstrap: str, partitions: int, rate: float, seed: int, stop: Stop) -> None:
        super().__init__(f"kafka-{entity}", stop)
        self.entity, self.bootstrap, self.partitions = entity, bootstrap, partitions
        self.batch = max(1, round(rate))
        self.period = self.batch / rate
        self.rng = random.Random(seed)
        self.acked: list[str] = []
        self.unacked: list[str] = []
        self.failed_attempts = 0  # messages whose send failed (and were sent again): they may be on the topic twice
        self.errors: Counter[str] = Counter()
        self.producer: KafkaProducer | None = None
        self.sent = 0

    def _producer(self) -> KafkaProducer:
        if self.producer is None:
            # Not idempotent: tansu forgets producer ids on a restart. acks=all; a failure is retried by us.
            self.producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=False,
                                          retries=0, linger_ms=5, max_block_ms=5000, request_timeout_ms=5000,
                                          reconnect_backoff_max_ms=500)
        return self.producer

    def _drop(self) -> None:
        if self.producer is not None:
            try:
                self.producer.close(timeout=1)
            except Exception:
                pass
            self.producer = None

    def work(self) -> None:
        try:
            while not self.stop.soft.is_set():
                began = time.monotonic()
                pending = []
                for _ in range(self.batch):
                    pending.append((f"k{self.sent}", self.sent))
                    self.sent += 1
                if not self.deliver(pending):
                    return
                self.pace(self.period, began)
        finally:
            self._drop()

    def deliver(self, pending: list[tuple[str, int]]) -> bool:
        finish_by: float | None = None
        while pending:
            if self.stop.hard.is_set() or (finish_by is not None and time.monotonic() > finish_by):
                self.unacked.extend(u for u, _ in pending)
                return False
            if self.stop.soft.is_set():
                finish_by = finish_by or time.monotonic() + FINISH_S
            failed = []
            try:
                producer = self._producer()
                futures = [(u, s, producer.send(topic(self.entity), json.dumps(
                    {"uid": u, "src": "kafka", "seq": s}).encode(), partition=s % self.partitions))
                    for u, s in pending]
                producer.flush(timeout=10)
                for u, s, f in futures:
                    try:
                        f.get(timeout=10)
                        self.acked.append(u)
                    except Exception as exc:
                        self.errors[type(exc).__name__] += 1
                        failed.append((u, s))
            except Exception as exc:  # no broker: the producer cannot even be made, or send() blocked
                self.errors[type(exc).__name__] += 1
                failed = [p for p in pending if p[0] not in set(self.acked[-len(pending):])]
            if failed:
                self.failed_attempts += len(failed)
                self._drop()
                self.stop.hard.wait(0.3 + self.rng.random() * 0.4)
            pending = failed
        return True


def read_topic(bootstrap: str, name: str, partitions: int, timeout: float = 120.0
               ) -> tuple[list[tuple[int, int, str]], dict[str, Any]]:
    """Every message of the topic as (partition, offset, uid), up to the high watermarks; and per partition the
    position reached, the high watermark and the listed end offset (tansu's can under-report). A partition whose
    position stays below its high watermark with nothing more to fetch for 30 s is reported as `short`."""
    # tansu with S3 storage answers a fetch with nothing at all when reading its objects takes longer than the
    # fetch's max wait (100 ms: nothing, ever, from a topic of 2,000 small batches): wait longer.
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                             fetch_max_wait_ms=2000)
    try:
        tps = [TopicPartition(name, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        out: list[tuple[int, int, str]] = []
        give_up = time.monotonic() + timeout
        quiet_since = time.monotonic()
        while True:
            polled = consumer.poll(timeout_ms=200, max_records=50_000)
            for tp, records in polled.items():
                out.extend((tp.partition, r.offset, json.loads(r.value)["uid"]) for r in records)
            if polled:
                quiet_since = time.monotonic()
            quiet = time.monotonic() - quiet_since
            ends = {tp: consumer.highwater(tp) for tp in tps}
            caught_up = all(end is not None and consumer.position(tp) >= end for tp, end in ends.items())
            if (caught_up and quiet > 1.0) or quiet > 30.0 or time.monotonic() > give_up:
                listed = consumer.end_offsets(tps)
                info = {str(tp.partition): {"position": consumer.position(tp), "highwater": ends[tp],
                                            "listed_end": listed.get(tp)} for tp in tps}
                short = {p: i for p, i in info.items() if i["highwater"] is None or i["position"] < i["highwater"]}
                if short and time.monotonic() > give_up:
                    raise BenchError(f"could not read topic {name} to its end within {timeout:.0f}s: {info}")
                if not short or quiet > 30.0:
                    return out, {"partitions": info, "short": short}
    finally:
        consumer.close()


# --------------------------------------------------------------------------- checks


def read_table(uri: Path, columns: list[str]) -> dict[str, list]:
    """The given columns of a Delta table (those it has; None for the others); empty if there is no table."""
    try:
        table = DeltaTable(str(uri))
    except Exception:
        return {c: [] for c in columns}
    have = set(table.schema().to_arrow().names)
    data = table.to_pyarrow_table(columns=[c for c in columns if c in have])
    return {c: data.column(c).to_pylist() if c in have else [None] * data.num_rows for c in columns}


class Expected:
    """What one entity's table must hold at the end: uid -> count, and per source the uids by kind."""

    def __init__(self, entity: str, keyed: bool, pushers: list[Pusher], lander: Lander, producer: Producer,
                 on_topic: list[tuple[int, int, str]]) -> None:
        self.entity, self.keyed = entity, keyed
        self.push_acked = Counter(u for p in pushers for u in p.acked)
        self.push_unacked = Counter(u for p in pushers for u in p.unacked)
        self.landed = Counter(lander.landed)
        self.kafka_acked = set(producer.acked)
        self.topic = Counter(u for _, _, u in on_topic)
        self.coordinates = {(p, o) for p, o, _ in on_topic}
        self.counts: Counter[str] = Counter()
        for source in (self.push_acked, self.landed):
            self.counts.update(source)
        # An append entity holds a message as often as the topic does; an upsert entity once per uid.
        self.counts.update({u: 1 for u in self.topic} if keyed else self.topic)

    def waiting(self, uids: list[str]) -> int:
        have = Counter(uids)
        return sum(max(0, n - have[u]) for u, n in self.counts.items())


def count_source(expected: Counter, sent_unacked: Counter, stored: Counter, keyed: bool) -> dict[str, int]:
    want = {u: 1 for u in expected} if keyed else expected
    return {"expected": sum(want.values()),
            "found": sum(min(n, stored[u]) for u, n in want.items()),
            "missing": sum(max(0, n - stored[u]) for u, n in want.items()),
            "duplicated": sum(max(0, stored[u] - n) for u, n in want.items())
            + sum(max(0, stored[u] - 1) for u in sent_unacked),
            "unacknowledged": sum(sent_unacked.values()),
            "unacknowledged_stored": sum(1 for u in sent_unacked if stored[u] > 0)}


def check_entity(work: Path, exp: Expected) -> dict[str, Any]:
    lake = work / "lake" / exp.entity
    table = read_table(lake / "table", ["uid", "kafka_partition", "kafka_offset"])
    stored = Counter(table["uid"])
    push = count_source(exp.push_acked, exp.push_unacked, Counter({u: stored[u] for u in stored if u[0] == "p"}),
                        False)
    files = count_source(exp.landed, Counter(), Counter({u: stored[u] for u in stored if u[0] == "f"}), False)
    kafka = count_source(exp.topic, Counter(), Counter({u: stored[u] for u in stored if u[0] == "k"}), exp.keyed)
    kafka["acknowledged_by_broker"] = len(exp.kafka_acked)
    kafka["on_topic"] = sum(exp.topic.values())
    kafka["producer_duplicates_on_topic"] = sum(n - 1 for n in exp.topic.values() if n > 1)
    kafka["acknowledged_but_not_on_topic"] = len(exp.kafka_acked - set(exp.topic))  # the broker lost them
    if not exp.keyed:  # each message once: by its coordinates too
        coords = Counter(zip(table["kafka_partition"], table["kafka_offset"], strict=True))
        coords.pop((None, None), None)
        kafka["coordinates_missing"] = len(exp.coordinates - set(coords))
        kafka["coordinates_duplicated"] = sum(n - 1 for n in coords.values() if n > 1)
    known = set(exp.push_acked) | set(exp.push_unacked) | set(exp.landed) | set(exp.topic)
    out: dict[str, Any] = {
        "strategy": ENTITIES[exp.entity]["strategy"], "rows": len(table["uid"]),
        "push": push, "files": files, "kafka": kafka,
        "never_sent_found": sum(n for u, n in stored.items() if u not in known),
        "quarantined": len(read_table(lake / "quarantine", ["line"])["line"]),
    }
    if exp.keyed:  # one changelog entry per uid written once; a batch merged twice would add corrections
        changelog = Counter(read_table(lake / "changelog", ["uid"])["uid"])
        once = {u for u, n in exp.counts.items() if n == 1 and exp.topic[u] <= 1}
        out["changelog_extra_entries"] = sum(changelog[u] - 1 for u in once if changelog[u] > 1)
    return out


def problems_of(entity: str, r: dict[str, Any]) -> list[str]:
    out = []
    for source in ("push", "files", "kafka"):
        for what in ("missing", "duplicated", "acknowledged_but_not_on_topic", "coordinates_missing",
                     "coordinates_duplicated"):
            if r[source].get(what):
                out.append(f"{entity}.{source}: {r[source][what]} {what}")
    for what in ("never_sent_found", "quarantined", "changelog_extra_entries"):
        if r.get(what):
            out.append(f"{entity}: {r[what]} {what}")
    return out


# --------------------------------------------------------------------------- the run


class Run:
    def __init__(self, args: argparse.Namespace, work: Path, deadline: Deadline) -> None:
        self.args, self.work, self.deadline = args, work, deadline
        self.rng = random.Random(args.seed)
        self.entities = [e.strip() for e in args.entities.split(",") if e.strip()]
        self.stop = Stop()
        self.moto: Moto | None = None
        self.broker: DurableBroker | None = None
        self.daemon: Daemon | None = None
        self.workers: list[Worker] = []
        self.kills: list[dict[str, Any]] = []
        self.broker_kills: list[dict[str, Any]] = []
        self.unexpected_exits: list[dict[str, Any]] = []
        self.loadavg_samples: list[float] = []
        self.remembered = 0.0
        self.cut_short = False  # kills stopped early: --timeout ran short
        self.topic_ends: dict[str, dict[str, Any]] = {}
        self.stuck: list[dict[str, Any]] = []  # lives not ready within --ready-timeout (then killed like others)

    # ------------------------------------------------------------------ set-up

    def set_up(self) -> None:
        a = self.args
        self.moto = Moto(self.work / "moto.log")
        self.moto.create_bucket("tansu")
        self.broker = DurableBroker(self.work / "tansu.log", self.moto.endpoint)
        say(f"moto S3 on {self.moto.endpoint}; tansu (topics in S3) on {self.broker.bootstrap}")
        self.broker.start()
        for e in self.entities:
            self.broker.create_topic(topic(e), a.partitions)
        self.port = free_port()
        self.config = self.work / "lakefeed.yaml"
        self.config.write_text(yaml.safe_dump(config_doc(self.entities, self.port, self.broker.bootstrap,
                                                         a.trigger), sort_keys=False), encoding="utf-8")
        for e in self.entities:
            (self.work / "landing" / e / "data").mkdir(parents=True, exist_ok=True)
        self.daemon = Daemon(self.work, self.config)
        self.pushers = {e: [Pusher(e, i, self.port, a.push_workers / a.push_rate, a.push_records, a.resend,
                                   a.seed * 1000 + k * 10 + i, self.stop) for i in range(a.push_workers)]
                        for k, e in enumerate(self.entities)}
        self.landers = {e: Lander(e, self.work / "landing" / e / "data", 1 / a.file_rate, a.file_rows,
                                  a.seed * 1000 + k * 10 + 7, self.stop) for k, e in enumerate(self.entities)}
        self.producers = {e: Producer(e, self.broker.bootstrap, a.partitions, a.kafka_rate,
                                      a.seed * 1000 + k * 10 + 8, self.stop) for k, e in enumerate(self.entities)}
        self.workers = [w for e in self.entities for w in (*self.pushers[e], self.landers[e], self.producers[e])]

    # ------------------------------------------------------------------ chaos

    def watch(self, seconds: float, what: str) -> None:
        """Sleep `seconds`, checking the daemon, the load and the deadline."""
        assert self.daemon is not None
        end = time.monotonic() + seconds
        while True:
            self.deadline.check(what)
            for w in self.workers:
                if w.error is not None:
                    raise BenchError(f"the load failed in {w.name}: {w.error!r}")
            if self.daemon.died():
                assert self.daemon.proc is not None
                code = self.daemon.proc.returncode
                self.unexpected_exits.append({"life": len(self.daemon.lives), "exit_code": code,
                                              "after_s": round(self.daemon.up_s(), 1)})
                say(f"  the daemon exited by itself with {code} while {what}; starting it again\n"
                    + log_tail(self.daemon.log, 15))
                self.daemon.start()
            if time.monotonic() - self.remembered > 1.0:
                self.daemon.remember()
                self.remembered = time.monotonic()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.25, left))

    def kill_broker(self, i: int) -> None:
        assert self.broker is not None
        down = self.rng.uniform(0.5, self.args.max_broker_down)
        self.broker.kill()
        t = time.monotonic()
        self.watch(down, "the broker is down")
        self.broker.start()
        self.broker_kills.append({"during_interval": i, "down_s": round(time.monotonic() - t, 2)})
        say(f"  broker SIGKILLed, back after {time.monotonic() - t:.1f}s")

    def wait_ready(self, what: str) -> bool:
        return self.wait_working(what, ready=True)

    def wait_working(self, what: str, ready: bool = False) -> bool:
        """Wait until the current life works (its first committed batch, or daemon.ready), or with `ready` until
        daemon.ready; False (a stuck start-up, recorded) after --ready-timeout from the spawn."""
        assert self.daemon is not None
        while not (self.daemon.ready() if ready else self.daemon.working()):
            if self.daemon.up_s() > self.args.ready_timeout:
                self.stuck.append({"life": len(self.daemon.lives), "after_s": round(self.daemon.up_s(), 1),
                                   "log_tail": log_tail(self.daemon.log, 12)[-3000:]})
                say(f"  the daemon was not {'ready' if ready else 'working'} {self.args.ready_timeout:.0f}s after "
                    f"its spawn ({what})")
                return False
            self.watch(0.2, what)
        return True

    def chaos(self) -> None:
        a = self.args
        assert self.daemon is not None
        self.daemon.start()
        for w in self.workers:
            w.start()
        say(f"daemon started (port {self.port}); load running; {a.kills} kills to go")
        for i in range(1, a.kills + 1):
            if self.deadline.left() < a.reserve:
                self.cut_short = True
                say(f"only {self.deadline.left():.0f}s left of --timeout: no more kills after {i - 1} (the rest of the "
                    f"{a.reserve:.0f}s reserved for the end)")
                break
            kind = a.pattern[(i - 1) % len(a.pattern)]
            broker_due = bool(a.broker_every) and i % a.broker_every == 0
            if kind == "S":
                took = [life["working_s"] for life in self.daemon.lives if life["working_s"] is not None]
                kill_at = self.rng.uniform(0.3, 1.0) * (statistics.median(took) if took else 20.0)  # from spawn
                if broker_due:
                    self.watch(max(0.0, self.rng.uniform(0.0, kill_at) - self.daemon.up_s()), f"interval {i}")
                    self.kill_broker(i)
                self.watch(max(0.0, kill_at - self.daemon.up_s()), f"interval {i}")
            else:
                if kind == "R":
                    self.wait_ready(f"interval {i}")
                else:
                    self.wait_working(f"interval {i}")
                interval = self.rng.uniform(a.min_interval, a.max_interval)
                if broker_due:
                    first = self.rng.uniform(0.1, 0.6) * interval
                    self.watch(first, f"interval {i}")
                    self.kill_broker(i)
                    interval -= first
                self.watch(interval, f"interval {i}")
            self.loadavg_samples.append(os.getloadavg()[0])
            life = self.daemon.sigkill(a.leftover_wait)
            down = self.rng.uniform(0.0, a.max_down)
            self.kills.append({"kill": i, "aimed": KINDS[kind],
                               "after_s": life["killed_after_s"], "ready": life["ready"],
                               "working": life["working_s"] is not None, "batches_in_life": life["batches"],
                               "leftovers": life["leftovers"], "down_s": round(down, 2)})
            state = "ready" if life["ready"] else "working, not ready" if life["working_s"] is not None \
                else "starting"
            say(f"kill {i}/{a.kills}: SIGKILL {life['killed_after_s']:.1f}s after spawn ({state}, "
                f"{life['batches']} batches committed in that life"
                f"{', leftovers ' + str(life['leftovers']) if life['leftovers'] else ''}); down {down:.1f}s")
            self.watch(down, "the daemon is down")
            self.daemon.start()
        say(f"kills done; {a.tail:g}s more load once the daemon is ready again")
        if not self.wait_ready("after the last kill"):
            raise BenchError(f"the daemon was not ready {a.ready_timeout:.0f}s after the last restart")
        self.watch(a.tail, "the last stretch of load")

    # ------------------------------------------------------------------ the end

    def finish(self) -> dict[str, Any]:
        a = self.args
        assert self.daemon is not None and self.broker is not None
        say("stopping the load (pending pushes and Kafka batches are still sent until acknowledged)")
        self.stop.soft.set()
        give_up = time.monotonic() + FINISH_S + REQUEST_TIMEOUT_S + 15
        for w in self.workers:
            while w.is_alive():
                w.join(0.25)
                self.watch(0, "finishing the load")
                if time.monotonic() > give_up:
                    raise BenchError(f"{w.name} did not finish")
            if w.error is not None:
                raise BenchError(f"the load failed in {w.name}: {w.error!r}")
        say("reading the topics back")
        on_topic, self.topic_ends = {}, {}
        handler = logging.FileHandler(self.work / "kafka-client.log")  # what the client saw, should a read fail
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        kafka_log = logging.getLogger("kafka")
        kafka_log.addHandler(handler)
        kafka_log.setLevel(logging.INFO)
        try:
            for e in self.entities:
                on_topic[e], self.topic_ends[e] = read_topic(self.broker.bootstrap, topic(e), a.partitions,
                                                             max(10.0, self.deadline.left() - 60))
        finally:
            kafka_log.removeHandler(handler)
            kafka_log.setLevel(logging.WARNING)
            handler.close()
            if self.topic_ends[e]["short"]:
                say(f"  topic {topic(e)} could not be read to its high watermark: {self.topic_ends[e]}")
        expected = {e: Expected(e, "primary_key" in ENTITIES[e], self.pushers[e], self.landers[e],
                                self.producers[e], on_topic[e]) for e in self.entities}
        say("waiting until every expected record is in its table: "
            + ", ".join(f"{e} {sum(x.counts.values()):,}" for e, x in expected.items()))
        t = time.monotonic()
        last_say = t
        while True:
            waiting = {e: x.waiting(read_table(self.work / "lake" / e / "table", ["uid"])["uid"])
                       for e, x in expected.items()}
            if not any(waiting.values()):
                break
            if time.monotonic() - t > a.drain_timeout:
                say(f"  still waiting for {waiting} after {a.drain_timeout:.0f}s: giving up")
                break
            if time.monotonic() - last_say > 15:
                say(f"  waiting for {waiting}")
                last_say = time.monotonic()
            self.watch(1.0, "waiting for the tables")
        drain_s = round(time.monotonic() - t, 2)
        self.watch(2 * a.trigger + 1, "letting the last batches finish")
        say("SIGTERM to the daemon")
        code = self.daemon.stop(120)
        leftovers = self.daemon.clean_up(a.leftover_wait)
        say(f"  exit code {code}; running lakefeed verify")
        verify = subprocess.run([sys.executable, "-m", "lakefeed", "verify", "--config", str(self.config)],
                                cwd=self.work, capture_output=True, text=True, timeout=300)
        per_entity = {e: check_entity(self.work, x) for e, x in expected.items()}
        return {"drain_s": drain_s, "drained": not any(waiting.values()), "waiting_at_end": waiting,
                "exit_code": code, "leftovers_after_stop": leftovers, "topics": self.topic_ends,
                "verify": {"exit_code": verify.returncode, "output": (verify.stdout + verify.stderr)[-2000:]},
                "entities": per_entity}

    def clean_up(self) -> None:
        self.stop.soft.set()
        self.stop.hard.set()
        for w in self.workers:
            if w.is_alive():
                w.join(REQUEST_TIMEOUT_S + 5)
        if self.daemon is not None:
            self.daemon.clean_up()
        if self.broker is not None:
            self.broker.kill()
        if self.moto is not None:
            self.moto.stop()


def summary(run: Run, end: dict[str, Any]) -> dict[str, Any]:
    """The report's figures: kills, sources, totals, pass/fail."""
    ents = end["entities"]
    totals = Counter()
    for r in ents.values():
        totals["push_acknowledged"] += r["push"]["expected"]
        totals["push_unacknowledged"] += r["push"]["unacknowledged"]
        totals["push_unacknowledged_stored"] += r["push"]["unacknowledged_stored"]
        totals["files_landed_rows"] += r["files"]["expected"]
        totals["kafka_produced"] += r["kafka"]["acknowledged_by_broker"]
        totals["kafka_on_topic"] += r["kafka"]["on_topic"]
        totals["kafka_expected"] += r["kafka"]["expected"]
        for source in ("push", "files", "kafka"):
            totals["found"] += r[source]["found"]
            totals["missing"] += r[source]["missing"]
            totals["duplicated"] += r[source]["duplicated"]
        totals["kafka_acknowledged_but_not_on_topic"] += r["kafka"]["acknowledged_but_not_on_topic"]
        totals["never_sent_found"] += r["never_sent_found"]
        totals["quarantined"] += r["quarantined"]
    totals["expected"] = totals["push_acknowledged"] + totals["files_landed_rows"] + totals["kafka_expected"]
    problems = [p for e, r in ents.items() for p in problems_of(e, r)]
    if end["verify"]["exit_code"] != 0:
        problems.append(f"lakefeed verify exited with {end['verify']['exit_code']}")
    if end["exit_code"] != 0:
        problems.append(f"the daemon exited with {end['exit_code']} after SIGTERM")
    for e, ends in end["topics"].items():
        if ends["short"]:
            problems.append(f"topic {topic(e)} could not be read to its high watermark (the broker): {ends['short']}")
    if not end["drained"]:
        problems.append(f"not everything reached the tables: {end['waiting_at_end']}")
    rejected = [r for ps in run.pushers.values() for p in ps for r in p.rejected]
    if rejected:
        problems.append(f"{len(rejected)} push request(s) rejected for good, e.g. {rejected[0]}")
    resend_miss = sum(p.resends_not_duplicate for ps in run.pushers.values() for p in ps)
    if resend_miss:
        problems.append(f"{resend_miss} re-sent Idempotency-Key(s) answered without duplicate: true")
    if run.unexpected_exits:
        problems.append(f"the daemon exited by itself {len(run.unexpected_exits)} time(s)")
    return {"totals": dict(totals), "problems": problems, "rejected_pushes": rejected[:10],
            "resends_not_duplicate": resend_miss}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=50, help="SIGKILLs of the daemon (default 50)")
    p.add_argument("--seed", type=int, default=1, help="seed of the kill schedule and the load's sizes")
    p.add_argument("--broker-every", type=int, default=10,
                   help="SIGKILL the broker too in every N-th interval (0: never; default 10)")
    p.add_argument("--pattern", default="RRWRS",
                   help="when each kill aims, cycled: R a random time after daemon.ready, W after the life's first "
                        "committed batch (queries may still be starting), S during start-up (default RRWRS)")
    p.add_argument("--min-interval", type=float, default=1.0,
                   help="seconds from daemon.ready (R) or the first commit (W) to the SIGKILL, at least")
    p.add_argument("--max-interval", type=float, default=20.0, help="... at most (default 20)")
    p.add_argument("--ready-timeout", type=float, default=300.0,
                   help="a start-up not ready after this many seconds is recorded as stuck (and killed)")
    p.add_argument("--max-down", type=float, default=3.0, help="seconds the daemon stays down, at most")
    p.add_argument("--max-broker-down", type=float, default=5.0, help="seconds the broker stays down, at most")
    p.add_argument("--leftover-wait", type=float, default=10.0,
                   help="seconds the daemon's other processes get to end after its SIGKILL before they are killed")
    p.add_argument("--tail", type=float, default=10.0, help="seconds of load after the last restart is ready")
    p.add_argument("--entities", default="events,accounts", help=f"from {', '.join(ENTITIES)}")
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--push-rate", type=float, default=10.0, help="push requests/s per entity (closed loop)")
    p.add_argument("--push-workers", type=int, default=2, help="concurrent push producers per entity")
    p.add_argument("--push-records", type=int, default=20, help="records per push request, at most")
    p.add_argument("--resend", type=float, default=0.05, help="share of acknowledged requests sent once more")
    p.add_argument("--file-rate", type=float, default=1.0, help="files/s per entity")
    p.add_argument("--file-rows", type=int, default=100, help="rows per file, at most")
    p.add_argument("--kafka-rate", type=float, default=50.0, help="Kafka messages/s per entity")
    p.add_argument("--trigger", type=float, default=0.5, help="spark.trigger_interval_s (default 0.5)")
    p.add_argument("--drain-timeout", type=float, default=600.0,
                   help="seconds to wait at the end for every expected record")
    p.add_argument("--timeout", type=float, default=3600.0, help="overall deadline in seconds (default 3600)")
    p.add_argument("--reserve", type=float, default=900.0,
                   help="no kill starts with less than this many seconds of --timeout left: they are kept for the "
                        "last start-up, the drain and the checks (default 900)")
    p.add_argument("--workdir", type=Path, default=None, help="default: a fresh temporary folder")
    p.add_argument("--keep", action="store_true", help="keep the workdir (always kept when --workdir is given)")
    args = parse_args(p, argv, SMOKE)
    entities = [e.strip() for e in args.entities.split(",") if e.strip()]
    if not entities or set(entities) - set(ENTITIES) or len(set(entities)) != len(entities):
        p.error(f"--entities: a list of {', '.join(ENTITIES)}")
    if args.kills < 0 or args.min_interval < 0 or args.max_interval < args.min_interval \
            or not args.pattern or set(args.pattern) - set(KINDS):
        p.error(f"--kills >= 0, 0 <= --min-interval <= --max-interval, --pattern of {''.join(KINDS)}")
    if min(args.push_rate, args.file_rate, args.kafka_rate) <= 0 or min(args.push_workers, args.push_records,
                                                                        args.file_rows, args.partitions) < 1:
        p.error("rates must be positive and counts at least 1")

    deadline = Deadline(args.timeout)
    work, remove = workdir(p, args.workdir, args.keep, "lakefeed-chaos-")
    t0 = time.monotonic()
    report: dict[str, Any] = {"bench": "chaos", "smoke": args.smoke, "ok": False, "seed": args.seed,
                              "entities": {e: ENTITIES[e]["strategy"] for e in entities},
                              "kills_requested": args.kills, "broker_every": args.broker_every,
                              "pattern": args.pattern, "interval_s": [args.min_interval, args.max_interval],
                              "cpus": os.cpu_count(),
                              "loadavg_start": [round(x, 2) for x in os.getloadavg()], "workdir": str(work)}
    run = Run(args, work, deadline)
    # Clean up on SIGTERM as on Ctrl-C, and on Ctrl-C even when started in the background (which ignores SIGINT).
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        say(f"workdir {work}; {os.cpu_count()} cores, load average {report['loadavg_start']}")
        run.set_up()
        run.chaos()
        end = run.finish()
        figures = summary(run, end)
        after = [k for k in run.kills if k["ready"]]
        report.update({
            "kills": len(run.kills),
            "kills_cut_short_by_timeout": run.cut_short,
            "broker_kills": len(run.broker_kills),
            "kills_aimed": dict(Counter(k["aimed"] for k in run.kills)),
            "kills_while_starting": sum(1 for k in run.kills if not k["working"]),
            "kills_working_not_ready": sum(1 for k in run.kills if k["working"] and not k["ready"]),
            "kills_after_ready": len(after),
            "kills_in_lives_with_commits": sum(1 for k in run.kills if k["batches_in_life"] > 0),
            "kill_after_spawn_s": _spread([k["after_s"] for k in run.kills]),
            "spawn_to_first_commit_s": _spread([life["working_s"] for life in run.daemon.lives
                                                if life["working_s"] is not None]),
            "spawn_to_ready_s": _spread([life["ready_s"] for life in run.daemon.lives if life["ready_s"] is not None]),
            "lives_ready": sum(1 for life in run.daemon.lives if life["ready_s"] is not None),
            "stuck_startups": run.stuck,
            "failures_logged": [dict(f, life=n) for n, life in enumerate(run.daemon.lives, 1)
                                for f in life["failures"]][:20],
            "leftover_processes_after_kill": sum(len(k["leftovers"]) for k in run.kills),
            "daemon_starts": len(run.daemon.lives) if run.daemon else 0,
            "daemon_unexpected_exits": run.unexpected_exits,
            "batches_committed": sum(life.get("batches", 0) for life in run.daemon.lives) if run.daemon else 0,
            "push": {"requests": sum(p.requests for ps in run.pushers.values() for p in ps),
                     "attempts": sum(p.attempts for ps in run.pushers.values() for p in ps),
                     "statuses": dict(sum((p.statuses for ps in run.pushers.values() for p in ps), Counter())),
                     "resends": sum(p.resends for ps in run.pushers.values() for p in ps),
                     "resends_not_duplicate": figures["resends_not_duplicate"],
                     "rejected": figures["rejected_pushes"]},
            "files": {"landed": sum(lander.files for lander in run.landers.values())},
            "kafka": {"failed_attempts": sum(pr.failed_attempts for pr in run.producers.values()),
                      "unacknowledged": sum(len(pr.unacked) for pr in run.producers.values()),
                      "errors": dict(sum((pr.errors for pr in run.producers.values()), Counter()))},
            "records": {
                "acknowledged_push": figures["totals"]["push_acknowledged"],
                "unacknowledged_push": figures["totals"]["push_unacknowledged"],
                "unacknowledged_push_stored": figures["totals"]["push_unacknowledged_stored"],
                "landed_files": figures["totals"]["files_landed_rows"],
                "produced_kafka": figures["totals"]["kafka_produced"],
                "on_topic_kafka": figures["totals"]["kafka_on_topic"],
                "expected": figures["totals"]["expected"],
                "found": figures["totals"]["found"],
                "missing": figures["totals"]["missing"],
                "duplicated": figures["totals"]["duplicated"],
                "never_sent_found": figures["totals"]["never_sent_found"],
                "kafka_acknowledged_but_not_on_topic": figures["totals"]["kafka_acknowledged_but_not_on_topic"],
                "quarantined": figures["totals"]["quarantined"],
            },
            "per_entity": end["entities"],
            "topics": end["topics"],
            "drain_s": end["drain_s"],
            "daemon_exit_code": end["exit_code"],
            "leftover_processes_after_stop": end["leftovers_after_stop"],
            "verify": end["verify"],
            "verify_ok": end["verify"]["exit_code"] == 0,
            "problems": figures["problems"],
            "passed": not figures["problems"],
        })
        report["ok"] = report["passed"]
        say(f"{len(run.kills)} kills ({len(run.broker_kills)} of the broker): "
            f"{report['records']['expected']:,} records expected, {report['records']['found']:,} found, "
            f"{report['records']['missing']} missing, {report['records']['duplicated']} duplicated; verify "
            f"{'ok' if report['verify_ok'] else 'FAILED'}; {'PASS' if report['passed'] else 'FAIL'}")
        for problem in figures["problems"]:
            say(f"  problem: {problem}")
        return 0 if report["ok"] else 1
    except (BenchError, OSError, subprocess.SubprocessError) as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        say(f"FAILED: {report['error']}")
        if run.daemon is not None and run.daemon.lives:
            say("daemon log tail:\n" + log_tail(run.daemon.log))
        return 1
    except KeyboardInterrupt:
        report["error"] = "interrupted"
        return 1
    finally:
        run.clean_up()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        report["kills"] = report.get("kills", len(run.kills))
        report["broker_kills"] = report.get("broker_kills", len(run.broker_kills))
        report["wall_s"] = round(time.monotonic() - t0, 1)
        report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        report["loadavg_1m_at_kills"] = _spread(run.loadavg_samples)
        publish(report, work, remove and report.get("ok", False) is True)


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"min": round(min(values), 2), "median": round(statistics.median(values), 2),
            "max": round(max(values), 2)}


if __name__ == "__main__":
    sys.exit(main())
