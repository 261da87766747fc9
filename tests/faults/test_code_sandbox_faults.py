"""code.tests against completions that go for the score rather than the task, or for the trainer
(issue 31): each level (bwrap, process), as root and as an unprivileged user (setpriv to uid 65534,
skipped with the reason where that cannot be done). Real sandboxes, real processes, real users."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from sandbox_as_user import NOBODY, nobody_python, run_as

from grpocli.rewards import sandbox, uid_pool

BWRAP = pytest.mark.skipif(sandbox.bwrap_problem() is not None, reason=f"bubblewrap: {sandbox.bwrap_problem()}")
LEVELS = [pytest.param("process", id="process"), pytest.param("bwrap", id="bwrap", marks=BWRAP)]
USERS = [pytest.param("root", id="as-root", marks=pytest.mark.skipif(os.geteuid() != 0, reason="not root")),
         pytest.param("nobody", id="as-nobody", marks=pytest.mark.skipif(
             nobody_python()[0] is None, reason=f"no unprivileged run: {nobody_python()[1]}"))]

# One case each; no constant and no echo of an input passes any of them.
ASSERTS = ["assert add(1, 2) == 3\nassert add(2, 5) == 7"]
SCRIPT = ["def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 5) == 7\n\ncheck(add)"]
CALL = {"inputs": [[1, 2], [2, 5]], "outputs": [3, 7], "fn_name": "add"}
STDIO = {"inputs": ["1 2\n", "2 5\n"], "outputs": ["3\n", "7\n"]}
ADD = "def add(a, b):\n    return a + b"
SUMS = "print(sum(map(int, input().split())))"

TRUNCATE = """import glob, os
for path in glob.glob('*') + glob.glob('.*') + glob.glob('/sandbox/*') + glob.glob(os.environ['TMPDIR'] + '/*'):
    try:
        open(path, 'w').close()
    except OSError:
        pass
def add(a, b):
    return 0"""
REWRITE = """import glob
for path in glob.glob('*.py') + glob.glob('/sandbox/*.py') + ['tests.py', '/sandbox/tests.py']:
    try:
        open(path, 'w').write('pass')
    except OSError:
        pass
def add(a, b):
    return 0"""
BUILTINS = """import builtins, io
builtins.exec = lambda *a, **k: None
builtins.eval = lambda *a, **k: 3
builtins.compile = lambda *a, **k: None
builtins.open = lambda *a, **k: io.StringIO('')
def add(a, b):
    return 0"""
ALWAYS_EQUAL = """class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
def add(a, b):
    return Anything()"""
EQUAL_INT = """class Three(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def add(a, b):
    return Three(0)"""
TOKEN = """import gc, os, sys
found = set()
frame = sys._getframe()
while frame is not None:
    found.update(v for v in frame.f_locals.values() if isinstance(v, (str, bytes)))
    frame = frame.f_back
for obj in gc.get_objects():
    if isinstance(obj, dict):
        found.update(v for v in obj.values() if isinstance(v, (str, bytes)))
for token in [t if isinstance(t, bytes) else t.encode() for t in found if len(t) == 32]:
    for name in ('.verdict', 'verdict', '/sandbox/.verdict'):
        try:
            open(name, 'wb').write(token)
        except OSError:
            pass
    for fd in range(3, 64):
        try:
            os.write(fd, token + b'\\n')
        except OSError:
            pass
    print(token.decode(errors='replace'))
sys.stdout.flush()
os._exit(0)"""
HARD_CODE = """import glob, os, re
table = {}
paths = glob.glob('*') + glob.glob('.*') + glob.glob('/sandbox/*') + glob.glob(os.environ['TMPDIR'] + '/*')
paths += glob.glob('/proc/self/fd/*') + [f'/proc/{os.getppid()}/cmdline', '/proc/self/cmdline']
for path in paths:
    try:
        text = open(path, errors='replace').read(1 << 20)
    except OSError:
        continue
    for m in re.finditer(r'(?:add|candidate)\\((-?\\d+), (-?\\d+)\\) == (-?\\d+)', text):
        table[int(m.group(1)), int(m.group(2))] = int(m.group(3))
    for m in re.finditer(r'"outputs": \\[(.*?)\\]', text):
        table['outputs'] = m.group(1)
def add(a, b):
    return table.get((a, b), 0)"""
READ_EXPECTED = """import glob, os
for path in glob.glob('*') + glob.glob('/sandbox/*') + glob.glob(os.environ['TMPDIR'] + '/*') + glob.glob('/proc/self/fd/*'):
    try:
        text = open(path).read()
    except (OSError, UnicodeDecodeError):
        continue
    if text.strip() and not text[:1].isdigit():
        print(text)
        break"""
HACKS = {  # name: (code, tests)
    "truncates the test file": (TRUNCATE, ASSERTS),
    "rewrites the test file": (REWRITE, ASSERTS),
    "replaces builtins": (BUILTINS, ASSERTS),
    "replaces builtins (test code)": (BUILTINS, SCRIPT),
    "always equal": (ALWAYS_EQUAL, ASSERTS),
    "always equal (test code)": (ALWAYS_EQUAL, SCRIPT),
    "always equal (fn_name)": (ALWAYS_EQUAL, CALL),
    "int subclass equal": (EQUAL_INT, ASSERTS),
    "token from a frame": (TOKEN, ASSERTS),
    "token from a frame (test code)": (TOKEN, SCRIPT),
    "hard-codes the answers": (HARD_CODE, ASSERTS),
    "hard-codes the answers (test code)": (HARD_CODE, SCRIPT),
    "reads the expected stdout": (READ_EXPECTED, STDIO),
}
CORRECT = {"asserts": (ADD, ASSERTS), "test code": (ADD, SCRIPT), "fn_name": (ADD, CALL), "stdio": (SUMS, STDIO)}

FIFOS = """import os
for name in ('.verdict', 'verdict', 'stdout', 'stderr', 'replies', 'tests.py', 'stdin.txt', 'case.json'):
    for where in ('.', os.environ['TMPDIR']):
        try:
            os.mkfifo(os.path.join(where, name))
        except OSError:
            pass
{tail}"""
LINKS = """import os
for name in ('.verdict', 'verdict', 'stdout', 'stderr', 'replies', 'tests.py'):
    for where in ('.', os.environ['TMPDIR']):
        try:
            os.symlink('/dev/zero', os.path.join(where, name))
        except OSError:
            pass
{tail}"""
FLOOD = """import os
block = b'[' * (1 << 20)
for fd in range(3, 16):
    for _ in range(64):
        try:
            os.write(fd, block)
        except OSError:
            break
def add(a, b):
    return a + b"""
NESTED = """def add(a, b):
    x = []
    for _ in range(100000):
        x = [x]
    return x"""
SILENT = "import time\ndef add(a, b):\n    time.sleep(3600)"
ENDLESS_LINE = """import os
def add(a, b):
    for fd in range(3, 64):
        try:
            while True:
                os.write(fd, b'1' * 65536)
        except OSError:
            pass"""
FORKED = """import os, time
if os.fork() == 0:
    time.sleep(3600)
def add(a, b):
    return 0"""
TAMPERING = {  # name: (code, tests, passes): what the trainer reads is its own; the case's files are never opened
    "FIFOs where files were, exits": (FIFOS.format(tail="import sys\nsys.exit(0)"), ASSERTS, False),
    "links to /dev/zero, exits": (LINKS.format(tail="import sys\nsys.exit(0)"), ASSERTS, False),
    "FIFOs, test code": (FIFOS.format(tail="import sys\nsys.exit(0)"), SCRIPT, False),
    "links to /dev/zero, stdio": (LINKS.format(tail="import sys\nsys.exit(0)"), STDIO, False),
    "floods its descriptors": (FLOOD, ASSERTS, False),
    "answers nested 100000 deep": (NESTED, ASSERTS, False),
    "never answers the judge": (SILENT, SCRIPT, False),
    "an endless answer to the judge": (ENDLESS_LINE, SCRIPT, False),
    "a child keeps its descriptors": (FORKED, ASSERTS, False),
    "FIFOs and links, then correct": (FIFOS.format(tail=LINKS.format(tail=ADD)), ASSERTS, True),
}


def _job(cases: dict, isolation: str) -> dict:
    return {"completions": [f"```python\n{code}\n```" for code, *_ in cases.values()],
            "tests": [tests for _, tests, *_ in cases.values()],
            "args": {"isolation": isolation, "case_timeout": 2.0, "workers": 2}}


def _sandbox_processes() -> set[int]:
    """Live processes under a uid of the pool or of the unprivileged user (compare with those before)."""
    pool = range(uid_pool.UID_BASE, uid_pool.UID_BASE + uid_pool.UID_SLOTS)
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = dict(line.split(":", 1) for line in Path(f"/proc/{entry}/status").read_text().splitlines())
        except (OSError, ValueError):
            continue
        uid = int(status["Uid"].split()[0])
        if status["State"].split()[0] not in "ZX" and (uid in pool or uid == NOBODY):
            found.add(int(entry))
    return found


@pytest.fixture
def temp_root(monkeypatch):
    """A fresh temp dir for the sandbox (and a nobody run's TMPDIR), removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="grpo-sbx-faults-", dir="/tmp"))
    root.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("isolation", LEVELS)
def test_reward_hacks_score_zero_and_correct_solutions_one(isolation, user, temp_root):
    cases = {**CORRECT, **HACKS}
    result = run_as(user, _job(cases, isolation), temp_root / "run")
    scores = dict(zip(cases, result["scores"]))
    assert scores == {**dict.fromkeys(CORRECT, 1.0), **dict.fromkeys(HACKS, 0.0)}, result
    assert result["logged"]["sandbox/passed"] == 1 + 1 + 2 + 2  # the correct ones: fn_name and stdio have 2 cases


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("isolation", LEVELS)
def test_what_the_trainer_reads_back_cannot_hang_or_flood_it(isolation, user, temp_root):
    before = _sandbox_processes()
    started = time.monotonic()
    result = run_as(user, _job(TAMPERING, isolation), temp_root / "run")
    took = time.monotonic() - started
    expected = {name: 1.0 if passes else 0.0 for name, (_, _, passes) in TAMPERING.items()}
    assert dict(zip(TAMPERING, result["scores"])) == expected, result
    assert result["logged"]["sandbox/timeout"] >= 1  # the judge waited for an answer until the case's time ran out
    assert took < 120, took  # 10 cases of 2 s, two at a time, on a loaded machine
    assert result["peak_kib"] < 1 << 20, result["peak_kib"]  # the trainer's process (a link to /dev/zero: 4-5 GB)
    assert _sandbox_processes() <= before
    assert not [p for p in temp_root.rglob("*") if p.name.startswith("grpo-sandbox-")]


DISK_HOG = """import os
written = 0
block = b'x' * (1 << 20)
for where in ('.', os.environ['TMPDIR'], '/tmp', '/dev/shm', '/var/tmp'):
    for i in range(256):
        try:
            with open(os.path.join(where, f'hog{i}'), 'wb') as f:
                for _ in range(8):
                    f.write(block)
                    f.flush()
                    written += len(block)
        except OSError:
            break
print(written >> 20)"""
LOCKED = """import os
os.makedirs('a/b/c')
for name in ('a/b/c/f', 'a/b/g', 'a/h'):
    open(name, 'w').write('x')
for d in ('a/b/c', 'a/b', 'a'):
    os.chmod(d, 0)
os.mkdir(os.environ['TMPDIR'] + '/locked')
os.chmod(os.environ['TMPDIR'] + '/locked', 0)
print('locked')"""


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("isolation", LEVELS)
def test_a_case_writes_at_most_disk_mb_and_leaves_nothing(isolation, user, temp_root):
    if isolation == "process" and user == "nobody":
        pytest.skip("not bounded: a normal user's process-level case writes to your disk (docs/code-sandbox.md)")
    job = {"programs": [[DISK_HOG, "stdio", "", ""], [LOCKED, "stdio", "", ""]], "isolation": isolation,
           "limits": {"timeout_s": 20.0, "disk_mb": 16, "file_size_mb": 8}}
    (hog, hog_out), (locked, locked_out) = run_as(user, job, temp_root / "run")["outcomes"]
    assert hog == "failed" and 0 < int(hog_out) <= 16, hog_out  # all its places together: 16 MiB (was 2.1 GB in 2 s)
    assert locked == "failed" and locked_out.strip() == "locked", locked_out
    assert not [p for p in temp_root.rglob("*") if p.name.startswith("grpo-sandbox-")]


@pytest.mark.skipif(nobody_python()[0] is None, reason=f"no unprivileged run: {nobody_python()[1]}")
def test_a_normal_users_process_level_case_leaves_no_locked_directory(temp_root):
    job = {"programs": [[LOCKED, "stdio", "", ""]], "isolation": "process", "limits": {"timeout_s": 20.0}}
    [(status, out)] = run_as("nobody", job, temp_root / "run")["outcomes"]
    assert (status, out.strip()) == ("failed", "locked")
    assert list((temp_root / "run").iterdir()) == []  # its directory and what it locked are gone


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid pool is used by root only")
def test_the_uid_pool_is_where_only_root_writes(monkeypatch, tmp_path):
    with uid_pool.UidSlots(2) as uids:
        assert len(set(uids)) == 2 and all(uid >= uid_pool.UID_BASE for uid in uids)
    for path in (uid_pool.POOL_DIR, uid_pool.POOL_DIR.parent):
        info = os.lstat(path)
        assert stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o022, path
    tmp_path.chmod(0o755)
    made = tmp_path / "pool"  # another local user made the pool's directory first
    made.mkdir()
    os.chown(made, NOBODY, NOBODY)
    monkeypatch.setattr(uid_pool, "POOL_DIR", made)
    with pytest.raises(uid_pool.PoolError, match="owned by root"), uid_pool.UidSlots():
        pass
    assert list(made.iterdir()) == []  # nothing created where that user chose
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setattr(uid_pool, "POOL_DIR", tmp_path / "link")
    with pytest.raises(uid_pool.PoolError), uid_pool.UidSlots():
        pass
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.skipif(nobody_python()[0] is None, reason=f"no unprivileged run: {nobody_python()[1]}")
@pytest.mark.parametrize("isolation", LEVELS)
def test_an_unprivileged_user_runs_code_tests(isolation, temp_root):
    """Item 1: as a normal user code.tests raised TypeError before any case ran."""
    hostile = {"infinite loop": "while True:\n    pass", "memory hog": "x = bytearray(8 * 1024 ** 3)\nx[-1] = 1",
               "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
               "huge stdout": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)"}
    cases = {**{name: (ADD, ASSERTS) for name in ("a", "b")}, **{n: (c, ASSERTS) for n, c in hostile.items()}}
    before = _sandbox_processes()
    result = run_as("nobody", _job(cases, isolation), temp_root / "run")
    assert result["scores"] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0], result
    assert _sandbox_processes() <= before
    assert subprocess.run(["true"], check=False, timeout=5).returncode == 0
    assert json.dumps(result["logged"])  # the counts are logged as for root


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("isolation", LEVELS)
def test_a_world_readable_dataset_is_out_of_its_view(isolation, user, temp_root):
    """The answers in a file every user may read, at a path the completion knows: it cannot open it."""
    if os.geteuid() != 0:
        pytest.skip("the data is put in /run, which only root may write")
    if isolation == "process" and user == "nobody":
        pytest.skip("a normal user's process-level case reads what you can read (docs/code-sandbox.md)")
    folder = Path(tempfile.mkdtemp(prefix="grpo-sbx-data-", dir="/run"))  # not under /tmp, which a case's hides
    try:
        folder.chmod(0o755)
        data = folder / "code.jsonl"
        data.write_text(json.dumps({"tests": ASSERTS}) + "\n")
        data.chmod(0o644)
        steal = HARD_CODE.replace("paths = glob.glob('*')", f"paths = [{str(data)!r}] + glob.glob('*')")
        job = _job({"steals": (steal, ASSERTS), "correct": (ADD, ASSERTS)}, isolation)
        assert run_as(user, job, temp_root / "run")["scores"] == [0.0, 1.0]
        job = {"programs": [[f"print(open({str(data)!r}).read())", "stdio", "", ""]], "isolation": isolation}
        [(status, out)] = run_as(user, job, temp_root / "run")["outcomes"]
        assert status == "crashed" and "add(1, 2)" not in out, out
    finally:
        shutil.rmtree(folder)
