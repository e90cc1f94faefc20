"""Helpers shared by cmdc's tests (fakes, fault injection, hostile inputs, helper processes).
Test modules import them as `tests._support.<module>`; what a user's own tests need is public
in `cmdc.testing`."""
