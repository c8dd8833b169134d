"""Wings: nmt's optional features, each beside the core it builds on and named for what it is
(for the pyproject extra it needs, where there is one). They import the core (model, config,
data, decoding, engines, metrics, training, system) and each other; the core never imports a
wing (tests/system/test_imports.py): the front ends above them (nmt.inference.pipeline, nmt.serve,
nmt.commands) pass a wing's function or object in where the core uses one.

- markup/ (markup=html|xml, the `markup` extra): a text's inline tags read (parse.py), the
  sentences between them (document.py) and the tags put back into a translation (restore.py);
- glossary.py and terms.py: glossary= terms found in a source, and kept terms' exact texts;
- words.py (word scores) and align.py (alignments= from the attention);
- comet.py (comet=, train.comet, clean.comet_qe: the `comet` extra), mbr.py (minimum Bayes
  risk's utilities and pick: the `fastchrf` extra) and rerank.py (MBR's or reranking's choice);
- augment.py: train.augment's robustness modifiers;
- libretranslate/: LibreTranslate's HTTP API beside nmt-serve's own (api.py), its request
  kinds (requests.py), API keys (api_keys.py) and language identification (langid_codes.py:
  the `langid` extra);
- interop/: other toolkits' models in (nmt-import) and out (nmt-export: the `export` and
  `onnx` extras);
- ctranslate2.py: the CTranslate2 engine (engine=ctranslate2: the `ctranslate2` extra)."""
