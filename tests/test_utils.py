"""utils.py, the handout's helpers: scoring reads files with any line ends (the sampler
is tested against the batched decoder in test_decoding.py and in test_mingpt_demo.py)."""

import utils


def test_evaluate_places_reads_crlf_files(tmp_path):
    (tmp_path / 'dev.tsv').write_bytes(
        b'Where was Ada born?\tLondon\r\nWhere was Max born?\tOslo\r\n'
    )
    assert utils.evaluate_places(str(tmp_path / 'dev.tsv'), ['London', 'Paris']) == (2.0, 1.0)
