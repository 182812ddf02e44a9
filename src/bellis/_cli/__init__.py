"""TODO header."""
