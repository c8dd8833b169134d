"""A model's language codes as the language identifier py3langid names them.

py3langid labels most languages by ISO 639-1 (de, en, fr) and the rest by ISO 639-3 (gcf, yue).
Models name theirs in other styles: OPUS-MT by ISO 639-1 with regions or scripts (pt_br,
zh_Hant), M2M100 by ISO 639-1, NLLB-200 by ISO 639-3 and script (eng_Latn, deu_Latn), with the
individual codes of macro-languages (arb for Arabic, zsm for Malay). `label` maps any of them to
py3langid's label, so that detection chooses among a model's own languages.
"""

from __future__ import annotations

import re

# ISO 639-3 (and NLLB-200's individual codes of macro-languages) -> py3langid's 639-1 labels
TO_LANGID = dict(pair.split(":") for pair in """
afr:af amh:am ara:ar arb:ar asm:as aze:az azj:az bel:be bul:bg ben:bn bre:br bos:bs cat:ca
ces:cs cym:cy dan:da deu:de ell:el eng:en epo:eo spa:es est:et ekk:et eus:eu fas:fa pes:fa
fin:fi fra:fr fry:fy gle:ga gla:gd glg:gl guj:gu hau:ha heb:he hin:hi hrv:hr hat:ht hun:hu
hye:hy ind:id ibo:ig isl:is ita:it jpn:ja jav:jv kat:ka kaz:kk khm:km kan:kn kor:ko kur:ku
kmr:ku ckb:ku kir:ky lat:la lug:lg lin:ln lao:lo lit:lt lav:lv lvs:lv mlg:mg plt:mg mkd:mk
mal:ml mon:mn khk:mn mar:mr msa:ms zsm:ms mya:my nep:ne npi:ne nld:nl nor:no nob:no orm:om
gaz:om ori:or ory:or pan:pa pol:pl pus:ps pbt:ps por:pt que:qu quy:qu ron:ro rus:ru san:sa
sin:si slk:sk slv:sl som:so sqi:sq als:sq srp:sr swe:sv swa:sw swh:sw tam:ta tel:te tha:th
tgl:tl tur:tr uig:ug ukr:uk urd:ur uzb:uz uzn:uz vie:vi xho:xh yor:yo zho:zh zul:zu kin:rw
sme:se sna:sn sot:st arg:an fao:fo ltz:lb mlt:mt nno:nn oci:oc tgk:tg tuk:tk tat:tt vol:vo
bak:ba""".split())


def label(code: str, known: set[str]) -> str | None:
    """py3langid's label (one of `known`) for a model's language code, None where it has none:
    the code's language part (before - or _), lower-cased, as it is or through TO_LANGID."""
    base = re.split("[-_]", code)[0].lower()
    if base in known:
        return base
    mapped = TO_LANGID.get(base)
    return mapped if mapped in known else None
