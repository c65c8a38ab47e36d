"""The data on a fresh machine: the course's four files fetched once into data/ from a
starter zip (here served by a local HTTP server on 127.0.0.1, laid out as the course's),
each checked against its recorded md5 sum; a wrong, damaged or cut-short download refused
by name, and no source reachable a one-line error naming --from and the manual step."""

import hashlib
import http.server
import io
import os
import re
import shutil
import subprocess
import threading
import zipfile

import pytest

from conftest import NO_DATA, PYTHON, ROOT, tiny_corpus
from machinery import course_data, files

REAL = ROOT / 'data'


def tiny_files():
    """{name: bytes}: a tiny corpus under the course's four names."""
    text, people = tiny_corpus()
    rows = [f"Where was {n} born?\t{p}" for n, p in people.items()]
    return {
        'wiki.txt': text.encode(),
        'birth_places_train.tsv': ('\n'.join(rows[:12]) + '\n').encode(),
        'birth_dev.tsv': ('\n'.join(rows[12:]) + '\n').encode(),
        'birth_test_inputs.tsv': ''.join(r.split('\t')[0] + '\n' for r in rows[12:]).encode(),
    }


def starter_zip(contents, top='a5'):
    """A zip laid out as the course's starter: its folder, src/, the data files beside it,
    and what a Mac adds (__MACOSX/ with a '._' copy of each file)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, 'w', zipfile.ZIP_DEFLATED) as z:
        z.writestr(f'{top}/src/run.py', '# the handout code\n')
        z.writestr(f'{top}/collect_submission.sh', 'zip -r assignment5.zip src\n')
        for name, data in contents.items():
            z.writestr(f'{top}/{name}', data)
            z.writestr(f'__MACOSX/{top}/._{name}', b'\x00\x05\x16\x07 resource fork')
    return out.getvalue()


@pytest.fixture
def sums(monkeypatch):
    """The tiny files' sums recorded as the course's, and {name: bytes} of them."""
    contents = tiny_files()
    recorded = {n: (hashlib.md5(d).hexdigest(), len(d)) for n, d in contents.items()}
    monkeypatch.setattr(course_data, 'FILES', recorded)
    return contents


class Server:
    """An HTTP server on 127.0.0.1 serving `pages` ({path: bytes}); a path in `cut` is
    announced whole and sent half, as a dropped connection leaves it."""

    def __init__(self):
        self.pages, self.cut, self.requests = {}, set(), []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append(self.path)
                if self.path not in server.pages:
                    self.send_error(404)
                    return
                data = server.pages[self.path]
                self.send_response(200)
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2] if self.path in server.cut else data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path):
        return f'http://127.0.0.1:{self.httpd.server_port}{path}'

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def use(monkeypatch, tmp_path, *sources):
    """data/ is tmp_path/data, fetched from `sources`."""
    monkeypatch.setattr(files, 'DATA_DIR', tmp_path / 'data')
    monkeypatch.setenv('COURSE_DATA_SOURCES', ' '.join(sources))
    monkeypatch.chdir(tmp_path)
    return tmp_path / 'data'


def test_a_bare_name_fetches_the_four_files_once_and_checks_them(
    sums, server, tmp_path, monkeypatch, capsys
):
    server.pages['/a5.zip'] = starter_zip(sums)
    data = use(monkeypatch, tmp_path, server.url('/missing.zip'), server.url('/a5.zip'))
    assert files.read_text('wiki.txt') == sums['wiki.txt'].decode()
    assert {p.name: p.read_bytes() for p in data.iterdir()} == sums
    said = capsys.readouterr().err.splitlines()
    assert said[-1] == (
        f"{data}/: wiki.txt, birth_places_train.tsv, birth_dev.tsv, birth_test_inputs.tsv "
        f"fetched from {server.url('/a5.zip')} and checked (md5)"
    )
    assert server.requests == ['/missing.zip', '/a5.zip']  # the first source's 404, then the zip
    for name in sums:
        files.read_lines(name)
    assert server.requests == ['/missing.zip', '/a5.zip']  # once: the files are there now
    assert capsys.readouterr().err == ''


def test_the_2024_starters_wiki_without_its_final_newline_is_given_it_back(
    sums, server, tmp_path, monkeypatch
):
    server.pages['/a4.zip'] = starter_zip(
        {**sums, 'wiki.txt': sums['wiki.txt'].rstrip(b'\n')}, top='student'
    )
    data = use(monkeypatch, tmp_path, server.url('/a4.zip'))
    files.read_text('wiki.txt')
    assert (data / 'wiki.txt').read_bytes() == sums['wiki.txt']


@pytest.mark.parametrize(
    'damage, why',
    [
        (
            'other file',
            r"a5/wiki.txt: not the course's file \(md5 [0-9a-f]{32}, expected [0-9a-f]{32}\)",
        ),
        ('short file', r"a5/wiki.txt: cut short: [\d,]+ bytes, where the course's has [\d,]+"),
        ('cut zip', r'not a zip archive, or a damaged or cut short one'),
        ('cut download', r'cut short \([\d,]+ bytes arrived\)'),
    ],
)
def test_a_wrong_damaged_or_cut_short_download_is_refused_by_name(
    sums, server, tmp_path, monkeypatch, damage, why
):
    contents = dict(sums)
    if damage == 'other file':
        contents['wiki.txt'] = sums['wiki.txt'].replace(b'London', b'Lindon')
    if damage == 'short file':
        contents['wiki.txt'] = sums['wiki.txt'][:100]
    archive = starter_zip(contents)
    server.pages['/a5.zip'] = archive[:-200] if damage == 'cut zip' else archive
    if damage == 'cut download':
        server.cut.add('/a5.zip')
    data = use(monkeypatch, tmp_path, server.url('/a5.zip'))
    with pytest.raises(files.UserError) as refused:
        files.read_text('birth_dev.tsv')
    assert f"{server.url('/a5.zip')}: " in str(refused.value)
    assert re.search(why, str(refused.value))
    assert not data.exists() or list(data.iterdir()) == []  # nothing unchecked is written


def test_a_file_placed_by_hand_is_checked_and_a_wrong_one_never_used(sums, tmp_path, monkeypatch):
    data = use(monkeypatch, tmp_path)  # no source: nothing can be fetched
    data.mkdir()
    for name, contents in sums.items():
        (data / name).write_bytes(contents)
    assert files.read_lines('birth_dev.tsv') == sums['birth_dev.tsv'].decode().splitlines()
    (data / 'birth_dev.tsv').write_bytes(sums['birth_dev.tsv'][:-10])
    with pytest.raises(files.UserError, match=r"birth_dev.tsv: cut short: .*; never used"):
        files.read_lines('birth_dev.tsv')


def test_offline_the_error_names_the_sources_from_and_the_manual_step(sums, tmp_path, monkeypatch):
    use(monkeypatch, tmp_path, 'http://127.0.0.1:1/a5.zip', 'http://127.0.0.1:1/a4.zip')
    with pytest.raises(files.UserError) as refused:
        files.read_text('wiki.txt')
    assert str(refused.value) == (
        f"{tmp_path / 'data'}/ lacks wiki.txt, birth_places_train.tsv, birth_dev.tsv, "
        f"birth_test_inputs.tsv, and the course's data could not be fetched (2 addresses: could not be reached ([Errno 111] Connection refused)). "
        f"With the course's starter zip at hand: python tools/get_data.py --from STARTER_ZIP; "
        f"or copy wiki.txt, birth_places_train.tsv, birth_dev.tsv and birth_test_inputs.tsv "
        f"from the course's starter into data/ by hand (data/README.md)"
    )


def test_a_lookup_alone_fetches_nothing_and_other_names_are_found_as_before(
    sums, server, tmp_path, monkeypatch
):
    server.pages['/a5.zip'] = starter_zip(sums)
    data = use(monkeypatch, tmp_path, server.url('/a5.zip'))
    assert files.find_data_file('wiki.txt') == 'wiki.txt'  # a tool asking whether it is there
    assert files.find_data_file('corpus.txt') == 'corpus.txt'
    assert not data.exists() and server.requests == []
    (tmp_path / 'data').mkdir()
    (tmp_path / 'data' / 'corpus.txt').write_text('x\n')
    assert files.find_data_file('corpus.txt') == str(data / 'corpus.txt')


def get_data(*args, cwd):
    return subprocess.run(
        [PYTHON, str(ROOT / 'tools' / 'get_data.py'), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def real_files():
    if not all((REAL / name).is_file() for name in course_data.FILES):
        pytest.skip(NO_DATA)
    return {name: (REAL / name).read_bytes() for name in course_data.FILES}


@pytest.mark.slow
def test_get_data_from_a_zip_a_folder_or_an_address(server, tmp_path):
    """The command on its own, with the real files' recorded sums."""
    contents = real_files()
    (tmp_path / 'a5.zip').write_bytes(starter_zip(contents))
    server.pages['/a5.zip'] = starter_zip(contents)
    (tmp_path / 'unzipped').mkdir()
    zipfile.ZipFile(tmp_path / 'a5.zip').extractall(tmp_path / 'unzipped')
    for source in [tmp_path / 'a5.zip', tmp_path / 'unzipped', server.url('/a5.zip')]:
        target = tmp_path / 'data'
        done = get_data('--from', str(source), '--data', str(target), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"{target}/: the course's four data files, checked (md5)\n"
        assert {p.name: p.read_bytes() for p in target.iterdir()} == contents
        shutil.rmtree(target)
    wrong = tmp_path / 'wrong'
    wrong.mkdir()
    (wrong / 'wiki.txt').write_bytes(contents['wiki.txt'] + b'one more line\n')
    refused = get_data('--from', str(tmp_path / 'a5.zip'), '--data', str(wrong), cwd=tmp_path)
    assert refused.returncode == 2 and 'Traceback' not in refused.stderr
    assert refused.stderr.startswith(f"error: {wrong / 'wiki.txt'}: not the course's file (md5")
    assert sorted(p.name for p in wrong.iterdir()) == ['wiki.txt']  # left for the user to remove


@pytest.mark.slow
def test_a_handout_command_on_a_fresh_clone_fetches_from_the_server_and_runs(server, tmp_path):
    """`python src/dataset.py namedata` in a copy of the repository whose data/ is empty:
    offline, it and the London baseline stop with one line; with the server, it fetches and
    runs; then a wiki.txt cut short is refused by run.py before any work."""
    contents = real_files()
    server.pages['/a5.zip'] = starter_zip(contents)
    clone = tmp_path / 'clone'
    shutil.copytree(ROOT / 'src', clone / 'src', ignore=shutil.ignore_patterns('__pycache__'))
    shutil.copy(ROOT / 'london_baseline.py', clone)
    (clone / 'data').mkdir()
    for script in (['src/dataset.py', 'namedata'], ['london_baseline.py']):  # offline first
        ran = subprocess.run(
            [PYTHON, *script],
            cwd=clone,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, 'COURSE_DATA_SOURCES': ''},
        )
        assert ran.returncode == 2 and ran.stdout == '', ran.stderr
        assert ran.stderr.startswith(f"error: {clone / 'data'}/ lacks wiki.txt, ")
        assert len(ran.stderr.splitlines()) == 1
    env = {**os.environ, 'COURSE_DATA_SOURCES': server.url('/a5.zip')}
    command = [PYTHON, 'src/dataset.py', 'namedata']
    ran = subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert ran.stderr.splitlines()[0] == (
        f"{clone / 'data'}/: fetching the course's data files from {server.url('/a5.zip')}"
    )
    assert ran.stdout.count('x: Where was') == 4
    assert {p.name: p.read_bytes() for p in (clone / 'data').iterdir()} == contents
    (clone / 'data' / 'wiki.txt').write_bytes(contents['wiki.txt'][:1000])  # cut short
    command = [
        PYTHON,
        'src/run.py',
        'finetune',
        'vanilla',
        'wiki.txt',
        '--writing_params_path',
        'v.params',
        '--finetune_corpus_path',
        'birth_places_train.tsv',
        '--device',
        'cpu',
    ]
    ran = subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode != 0 and 'Traceback' not in ran.stderr
    assert ran.stderr.startswith(f"error: {clone / 'data' / 'wiki.txt'}: cut short: 1,000 bytes")
    assert server.requests == ['/a5.zip']


def test_the_recorded_sums_are_the_shared_datas():
    contents = real_files()
    assert {n: (hashlib.md5(d).hexdigest(), len(d)) for n, d in contents.items()} == (
        course_data.FILES
    )


def test_a_class_with_data_of_its_own_records_its_sums(tmp_path, monkeypatch):
    contents = tiny_files()
    data = use(monkeypatch, tmp_path)
    data.mkdir()
    for name, bytes_ in contents.items():
        (data / name).write_bytes(bytes_)
    with pytest.raises(files.UserError, match='wiki.txt: cut short'):
        files.read_text('wiki.txt')
    own = ' '.join(f"{n}={hashlib.md5(d).hexdigest()}" for n, d in contents.items())
    monkeypatch.setenv('COURSE_DATA_MD5', own)
    assert files.read_text('wiki.txt') == contents['wiki.txt'].decode()
    monkeypatch.setenv('COURSE_DATA_MD5', 'wiki.txt=nothex')
    with pytest.raises(
        files.UserError, match=r"^COURSE_DATA_MD5: 'wiki.txt=nothex' is not NAME=MD5"
    ):
        files.read_text('birth_dev.tsv')
