"""Shared test helpers, imported as ``tests.support.<module>``.

One home for what several test folders need: the in-process gateway harness (built the
way ``mqgw run`` builds the app), message builders and unique names. Test files import
from here instead of editing ``sys.path``.
"""
