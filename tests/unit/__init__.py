"""Unit tests: pure logic, no database, no network."""
