"""Markup (markup=html|xml): a text's inline tags read into a Document (parse.py), the Document
of sentences between them (document.py), and each sentence's tags put back into its
translation (restore.py)."""
