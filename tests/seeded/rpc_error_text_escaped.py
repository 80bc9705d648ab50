"""Seeded bug: the reference caller re-raises a remote error's text without torch's unicode_escape decoding.

The remote repr ``ValueError('line1\\nline2')`` then keeps a literal
backslash-n where torch's caller (internal._handle_exception) shows a line
break (what the reference agents did before). Caught by the error-text clause.
"""

from tests.seeded.rpc_base import RpcBugHost, agent_module, plant_in


def _undecoded(original):
    def raise_remote(exc_type, text):
        # BUG: escaped again so that decoding gives the text back as sent, literal "\n" included
        return original(exc_type, text.encode("unicode_escape").decode("ascii"))
    return raise_remote


DISTCONFORM_SPEC = plant_in("rpc_error_text_escaped", agent_module, "raise_remote", _undecoded, RpcBugHost)
