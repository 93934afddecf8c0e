"""Shared helpers every side may use: PSNR, atomic file writes, an event loop in a thread, CLI help, figures."""
