"""Test harnesses: a served daemon, a fake OpenAI server, a headless browser, the soak."""
