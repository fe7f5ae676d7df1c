"""Runs inside a task's container (stdlib only, any Python 3.11+): where can this user read the original code?

Reads one JSON object from stdin (sent by pipeline/tasks/answer_search.py, never written to disk, so the
search cannot find its own needles) and prints one JSON object: every path where a needle was found.

- Text: a needle is a window of the original source (the lines the gold patch adds, with up to two lines of
  context each side), matched as consecutive stripped non-blank lines, so a line that merely recurs
  elsewhere (`return result` in the stdlib) is no hit. A unified diff is also read as its two sides.
- Git objects: loose objects are inflated here; every git directory found is read whole with
  `git cat-file --batch-all-objects --batch` (packed, unreachable, stashed and reflogged objects included).
- Archives (wheels, eggs, zips, tarballs): their members, one level deep.
- Bytecode: each .pyc of this interpreter's magic is unmarshalled and its code objects compared with those of
  the original compiled here: a function whose bytecode, constants and names are the original's and not
  the bug's is the original's compiled code, whatever file or line it claims.
"""

import importlib.util
import io
import json
import marshal
import os
import re
import subprocess
import sys
import tarfile
import types
import zipfile
import zlib

MAX_BYTES = 64 << 20  # files above this are images or databases, not source
LOOSE = re.compile(r"/objects/[0-9a-f]{2}/[0-9a-f]{38}$")
ARCHIVE = (".whl", ".egg", ".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


def fingerprint(code):
    consts = tuple(("code", c.co_qualname) if isinstance(c, types.CodeType) else
                   tuple(sorted(map(repr, c))) if isinstance(c, frozenset) else repr(c) for c in code.co_consts)
    return code.co_qualname, code.co_code, consts, code.co_names


def code_objects(code):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from code_objects(c)


def prints(source):
    try:
        return {fingerprint(c) for c in code_objects(compile(source, "<task>", "exec", dont_inherit=True))}
    except (SyntaxError, ValueError):
        return set()


class Search:
    def __init__(self, job):
        self.windows = [w for w in job["windows"] if w]
        self.keys = [max(w, key=len).encode() for w in self.windows]  # cheap filter before the line match
        self.owned = {os.path.join(job["workdir"], p) for p in job["owned"]}
        self.owned_blobs = set(job["owned_blobs"])
        original = set().union(*(prints(s) for s in job["originals"].values())) if job["originals"] else set()
        buggy = set().union(*(prints(s) for s in job["buggy"].values())) if job["buggy"] else set()
        self.code_prints = original - buggy
        self.code_names = {p[0].rsplit(".", 1)[-1].encode() for p in self.code_prints}
        self.skip = set(job["skip"])
        self.private = job.get("private") or "/nonexistent"
        self.found, self.legit, self.unreadable, self.files, self.private_files = [], 0, 0, 0, 0
        self.git_read = set()  # objects git already read: a loose one is not inflated (and reported) again

    def hit(self, path, how):
        self.found.append({"path": path, "how": how})

    def text_holds(self, data):
        if not any(k in data for k in self.keys):
            return False
        text = data.decode("utf-8", "replace")
        sides = [text]
        if "\n@@ " in text or text.startswith("@@ "):  # a diff: its old and new sides are code too
            old, new = [], []
            for line in text.splitlines():
                tag, body = line[:1], line[1:]
                if tag in " -" and not line.startswith("---"):
                    old.append(body)
                if tag in " +" and not line.startswith("+++"):
                    new.append(body)
            sides += ["\n".join(old), "\n".join(new)]
        return any(self.window_in(side) for side in sides)

    def window_in(self, text):
        lines = [s for s in (line.strip() for line in text.splitlines()) if s]
        for window in self.windows:
            n = len(window)
            for i, line in enumerate(lines):
                if line == window[0] and lines[i:i + n] == window:
                    return True
        return False

    def bytecode_holds(self, data):
        if not self.code_prints or data[:4] != importlib.util.MAGIC_NUMBER:
            return False
        if not any(name in data for name in self.code_names):
            return False
        try:
            code = marshal.loads(data[16:])
        except (ValueError, EOFError, TypeError):
            return False
        return any(fingerprint(c) in self.code_prints for c in code_objects(code))

    def blob(self, path, data, how):
        """Look at one file's (or member's, or object's) bytes."""
        if path.endswith((".pyc", ".pyo")) and self.bytecode_holds(data):
            self.hit(path, "bytecode")
        elif self.text_holds(data):
            self.hit(path, how)

    def file(self, path):
        try:
            if os.path.getsize(path) > MAX_BYTES:
                return
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            self.unreadable += 1
            return
        self.files += 1
        self.private_files += path.startswith(self.private + "/")
        if path in self.owned:
            self.legit += self.text_holds(data)
            return
        if LOOSE.search(path):
            self.loose(path, data)
        elif path.endswith(ARCHIVE) or data[:4] == b"PK\x03\x04":
            self.archive(path, data)
        self.blob(path, data, "file")

    def loose(self, path, data):
        try:
            raw = zlib.decompress(data)
        except zlib.error:
            return
        sha = path[-41:].replace("/", "")
        if sha not in self.git_read and sha not in self.owned_blobs and self.text_holds(raw.partition(b"\0")[2]):
            self.hit(path, "git object " + sha)

    def archive(self, path, data):
        try:
            if data[:4] == b"PK\x03\x04":
                with zipfile.ZipFile(io.BytesIO(data)) as z:
                    members = [(i.filename, z.read(i)) for i in z.infolist() if i.file_size <= MAX_BYTES]
            else:
                with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                    members = [(m.name, tar.extractfile(m).read()) for m in tar if m.isfile() and m.size <= MAX_BYTES]
        except (OSError, EOFError, tarfile.TarError, zipfile.BadZipFile, zlib.error, NotImplementedError):
            return
        for name, member in members:
            self.blob(f"{path}!{name}", member, "archive member")

    def git_dir(self, path):
        """Every object of the repository at `path` (a .git folder or a bare one), as git itself reads them."""
        try:
            out = subprocess.run(["git", "-c", "safe.directory=*", f"--git-dir={path}", "cat-file",
                                  "--batch-all-objects", "--batch", "--unordered"],
                                 capture_output=True, timeout=600).stdout
        except (OSError, subprocess.TimeoutExpired):
            return
        at = 0
        while at < len(out):
            end = out.find(b"\n", at)
            if end < 0:
                break
            header = out[at:end].split()
            if len(header) != 3:  # "<sha> missing": nothing follows
                at = end + 1
                continue
            size = int(header[2])
            sha, content = header[0].decode(), out[end + 1:end + 1 + size]
            at = end + 1 + size + 1
            self.git_read.add(sha)
            if sha not in self.owned_blobs and self.text_holds(content):
                self.hit(f"{path}:{sha}", f"git {header[1].decode()} object")

    def walk(self):
        for folder, dirs, files in os.walk("/", onerror=lambda e: setattr(self, "unreadable", self.unreadable + 1)):
            dirs[:] = [d for d in dirs if os.path.join(folder, d) not in self.skip
                       and not os.path.islink(os.path.join(folder, d))]
            if "HEAD" in files and "objects" in dirs:
                self.git_dir(folder)
            for name in files:
                path = os.path.join(folder, name)
                if not os.path.islink(path) and os.path.isfile(path):
                    self.file(path)


def main():
    job = json.loads(sys.stdin.buffer.read(int(sys.argv[1])))
    search = Search(job)
    search.walk()
    print(json.dumps({"found": search.found, "legit": search.legit, "unreadable": search.unreadable,
                      "files": search.files, "code_prints": len(search.code_prints),
                      "private_files_read": search.private_files}))


if __name__ == "__main__":
    main()
