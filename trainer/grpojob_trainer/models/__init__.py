"""Model directories: Hugging Face hub downloads and caches (`hub`), and a tiny random model for tests and demos
(`tiny`)."""
