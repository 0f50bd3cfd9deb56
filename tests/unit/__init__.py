"""Unit tests, laid out as provider/ is: tests/README.md says where a test goes."""
