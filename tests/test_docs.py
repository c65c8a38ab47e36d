"""The Markdown files: every relative link reaches a file of the repository, and every
anchor a heading of the file it names (as GitHub makes a heading's anchor)."""

import re

import pytest

from conftest import ROOT

SKIPPED = {'.venv', 'longrun', 'node_modules', '.git', '.pytest_cache'}
LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
CODE = re.compile(r'```.*?```|`[^`\n]*`', re.S)


def markdown_files():
    return sorted(p for p in ROOT.rglob('*.md') if not SKIPPED & set(p.relative_to(ROOT).parts))


def anchors(path):
    """The anchors of path's headings: lower case, punctuation dropped, spaces to hyphens,
    a repeated one numbered (-1, -2) as GitHub numbers them."""
    seen, found = {}, set()
    text = CODE.sub(lambda m: '' if m.group().startswith('```') else m.group(), path.read_text())
    for line in text.split('\n'):
        match = re.match(r'#{1,6} (.+)$', line)
        if not match:
            continue
        slug = re.sub(r'[^\w\- ]', '', match.group(1).replace('`', '').lower()).replace(' ', '-')
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f'{slug}-{count}')
    return found


def test_the_anchor_rule_is_githubs(tmp_path):
    page = tmp_path / 'page.md'
    page.write_text(
        "# Title\n\n## The `--seed` flag: (a) and b?\n\n## Title\n```\n# not a heading\n```\n"
    )
    assert anchors(page) == {'title', 'the---seed-flag-a-and-b', 'title-1'}


@pytest.mark.parametrize('path', markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_exists(path):
    text = CODE.sub('', path.read_text())
    broken = []
    for target in LINK.findall(text):
        if re.match(r'[a-z]+:', target):  # https:, mailto:
            continue
        file, _, anchor = target.partition('#')
        where = (path.parent / file).resolve() if file else path
        if not where.exists():
            broken.append(f'{target}: no such file')
        elif anchor and where.suffix == '.md' and anchor not in anchors(where):
            broken.append(f'{target}: no such heading')
    assert not broken, broken
