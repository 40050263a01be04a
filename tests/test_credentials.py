"""URL logins are split off (credentials.split_userinfo) and scrubbed from everything written (credentials.scrub)."""
from __future__ import annotations

from cudastack.core.credentials import redact, scrub, split_userinfo
from cudastack.plan.planner import make_plan
from cudastack.plan.rules import Resources


def test_split_and_scrub():
    assert split_userinfo("https://u:p@h.example:8443/simple?x=1") == ("https://h.example:8443/simple?x=1", True)
    assert split_userinfo("https://h.example/simple") == ("https://h.example/simple", False)
    assert redact("https://tok@h.example/s") == "https://h.example/s"
    text = "Looking in indexes: https://user:****@h.example/simple, http://tok3n@10.0.0.1:8080/s"
    assert scrub(text) == "Looking in indexes: https://h.example/simple, http://10.0.0.1:8080/s"
    assert scrub("git+ssh://git@github.com/x/y") == "git+ssh://git@github.com/x/y"   # an account, not a secret
    assert scrub({"u": ["https://a:b@h/x"], "https://c:d@h/": 1}) == {"u": ["https://h/x"], "https://h/": 1}
    assert scrub("mail me: a@b.c") == "mail me: a@b.c"


def test_error_messages_carry_no_login():
    from cudastack.core.errors import LockError

    err = LockError("pip could not reach https://ci:s3cr3t@pypi.example/simple/x/ (HTTP 503)")
    assert "s3cr3t" not in str(err) and "https://pypi.example/simple/x/" in str(err)


def test_plan_keeps_the_login_out_of_build_args_and_hash(recipes_copy):
    import yaml

    f = recipes_copy / "flashinfer.yaml"
    d = yaml.safe_load(f.read_text())
    entry = d["toolchains"]["13.1"]
    entry["index"] = "https://ci:s3cr3t-aa@pypi.example/simple"
    f.write_text(yaml.safe_dump(d))
    a = make_plan(recipes_copy, "13.1", resources=Resources(2, 24.0)).node("flashinfer")
    entry["index"] = "https://ci:s3cr3t-bb@pypi.example/simple"
    f.write_text(yaml.safe_dump(d))
    b = make_plan(recipes_copy, "13.1", resources=Resources(2, 24.0)).node("flashinfer")
    assert a.build_args["PIP_INDEX_URL"] == "https://pypi.example/simple"
    assert a.index_secret == "https://ci:s3cr3t-aa@pypi.example/simple"
    assert "s3cr3t" not in repr(a.build_args) + repr(a.inputs)
    assert a.hash == b.hash          # a rotated token rebuilds nothing
    from cudastack.build.bake import bake_dict

    plan = make_plan(recipes_copy, "13.1", resources=Resources(2, 24.0))
    names = {n.name: n.name for n in plan.nodes}
    bake = bake_dict(plan, contexts=names, dockerfiles=names, wheel_outputs=names)
    assert "s3cr3t" not in repr(bake)
    assert "id=pipindex,env=CUDASTACK_PIP_INDEX_URL_FLASHINFER" in bake["target"]["flashinfer"]["secret"]
