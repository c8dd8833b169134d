"""LibreTranslate's HTTP API beside nmt-serve's own (api.py): which requests are its
(requests.py), the API keys both APIs check (api_keys.py), and the language identifier's
codes for source=auto and /detect (langid_codes.py)."""
