"""Write tests/data/manifest_8f24062_{bilingual,multilingual}.json with nmt at commit 8f24062
(run with that checkout first on sys.path: PYTHONPATH=OLD:OLD/tests python THIS OUT_DIR).

nmt-preprocess of the tests' toy corpora: two corpora (one tagged <BT>) with keep_text, and
en-de, de-en and en-fr in one multilingual directory; the temporary directory written as DATA/."""

import re
import sys
import tempfile
from pathlib import Path

from conftest import make_corpora_dir
from multi_helpers import multi_overrides, write_raw

from nmt.commands.preprocess import preprocess
from nmt.config import PreprocessConfig, compose, to_object


def main(out: Path) -> None:
    """Preprocess both directories; keep their manifests."""
    work = Path(tempfile.mkdtemp())
    bilingual = make_corpora_dir(work / "bi")
    multilingual = work / "multi"
    preprocess(to_object(compose("preprocess", multi_overrides(write_raw(work / "raw"),
                                                               multilingual)),
                         PreprocessConfig))
    for name, data in (("bilingual", bilingual), ("multilingual", multilingual)):
        text = (data / "manifest.json").read_text(encoding="utf-8")
        (out / f"manifest_8f24062_{name}.json").write_text(
            re.sub(r'/tmp/[^"/]+/', "DATA/", text), encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
