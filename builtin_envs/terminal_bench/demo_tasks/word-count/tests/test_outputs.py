from pathlib import Path

SENTENCE = "the quick brown fox jumps over the lazy dog"


def test_words_one_per_line():
    words = Path("/app/words.txt").read_text().split("\n")
    assert [w for w in words if w] == SENTENCE.split()


def test_distinct_count():
    assert Path("/app/count.txt").read_text().strip() == str(len(set(SENTENCE.split())))
