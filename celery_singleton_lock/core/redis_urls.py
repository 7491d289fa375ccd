"""Deployments: which redis-py client a URL makes, how a client is named without its password,
and what differs on a Redis Cluster. See docs/deployment.md.

URL forms (``[user[:password]@]`` is an ACL login, or ``:password@`` for ``requirepass``)::

    redis://[user:password@]host[:port][/db]            one server
    rediss://...                                        one server over TLS
    unix://[user:password@]/path/to/socket[?db=N]       one server on a Unix socket
    redis+cluster://[user:password@]host:port[,host:port...]   Redis Cluster (seed nodes)
    rediss+cluster://...                                       Redis Cluster over TLS
    sentinel://[user:password@]host:port[,host:port...]/master-name[/db]   Sentinel
    rediss+sentinel://...                                      Sentinel, TLS to master and sentinels

``redis+sentinel://`` is accepted for ``sentinel://``; Kombu's spelling of a sentinel list,
whole URLs joined by ``;`` (``sentinel://:pw@h1:26379/0;sentinel://:pw@h2:26379/0``), for the
``,`` list; and ``?master_name=NAME`` for the path. Query options
(``socket_timeout``, ``ssl_cert_reqs``, ...) are redis-py's. The login of a Sentinel URL is
the master's; sentinels that need their own go in ``sentinel_kwargs``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode

import redis
from redis import connection

CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}
SENTINEL_SCHEMES = {"sentinel": False, "redis+sentinel": False, "rediss+sentinel": True}
DEFAULT_SENTINEL_PORT = 26379
SINGLE_SCHEMES = ("redis", "rediss", "unix")


def url_scheme(url: str) -> str:
    """The scheme of ``url`` in lower case (``redis``, ``rediss+cluster``, ``sentinel``...),
    "" when it has none: what decides which kind of client :func:`connect` makes."""
    return url.split("://", 1)[0].lower() if "://" in url else ""


def connect(url: str, **redis_kwargs: Any) -> Any:
    """The redis-py client for ``url``: ``redis.Redis``, ``redis.cluster.RedisCluster``, or
    a Sentinel-managed master client. ``redis_kwargs`` go to the connections."""
    from redis import cluster, sentinel

    return _connect(url, redis_kwargs, redis.Redis, cluster, sentinel.Sentinel)


def connect_async(url: str, **redis_kwargs: Any) -> Any:
    """The ``redis.asyncio`` client for ``url``: ``redis.asyncio.Redis``,
    ``redis.asyncio.cluster.RedisCluster`` or a Sentinel-managed master client; no I/O (a
    Cluster client learns its nodes at its first command)."""
    import redis.asyncio
    from redis.asyncio import cluster, sentinel

    return _connect(url, redis_kwargs, redis.asyncio.Redis, cluster, sentinel.Sentinel)


def _connect(
    url: str, redis_kwargs: dict[str, Any], single: Any, cluster: Any, sentinel_class: Any
) -> Any:
    """:func:`connect` with redis-py's client classes or their asyncio twins."""
    check_url(url)
    scheme = url_scheme(url)
    if scheme in CLUSTER_SCHEMES:
        nodes, options = _cluster_parts(url, CLUSTER_SCHEMES[scheme])
        options.update(redis_kwargs)
        startup = [cluster.ClusterNode(host, port or 6379) for host, port in nodes]
        return cluster.RedisCluster(startup_nodes=startup, **options)
    if scheme in SENTINEL_SCHEMES:
        return _sentinel(url, SENTINEL_SCHEMES[scheme], redis_kwargs, sentinel_class)
    client = single.from_url(url, **redis_kwargs)
    pool: Any = client.connection_pool
    try:
        # Making a connection object does no I/O, but refuses keywords it does not know:
        # now, rather than at the first command of every run.
        pool.connection_class(**pool.connection_kwargs)
    except TypeError as exc:
        raise ValueError(f"bad client keyword argument: {exc}") from None
    return client


def check_url(url: str) -> None:
    """Raise ``ValueError`` (saying how to fix it) if ``url`` can never reach a Redis: no
    or an unknown scheme, a bad host list or port, a database that is not a number >= 0.
    No I/O: whether the server has that many databases is only known when it answers."""
    scheme = url_scheme(url)
    if scheme in CLUSTER_SCHEMES:
        _cluster_parts(url, CLUSTER_SCHEMES[scheme])
        return
    if scheme in SENTINEL_SCHEMES:
        _sentinel_parts(url, SENTINEL_SCHEMES[scheme])
        return
    if scheme not in SINGLE_SCHEMES:
        given = f"scheme {scheme + '://'!r}" if scheme else "no scheme"
        raise ValueError(
            f"{given}: not a Redis URL; use redis://host:6379/0 (or rediss://, unix://, "
            "redis+cluster://, sentinel://)"
        )
    parse_url: Any = connection.parse_url  # untyped in redis-py
    options = parse_url(url)
    if scheme != "unix":
        _check_db_path(url.split("://", 1)[1].partition("?")[0].partition("/")[2])
    if options.get("db", 0) < 0:
        raise ValueError(f"database must be a number >= 0, got {options['db']}")


def _check_db_path(path: str) -> None:
    """redis-py reads ``/abc`` as database 0: refuse it rather than lock in the wrong one."""
    if path and not path.isdigit():
        raise ValueError(f"the path must be /<database number>, such as /0, got /{path}")


def _split(url: str) -> tuple[str, list[tuple[str, int]], str, dict[str, str]]:
    """(login with its ``@`` or "", [(host, port)], path, query) of a multi-host URL."""
    rest = url.split("://", 1)[1]
    if ";" in rest:
        rest = _join_kombu_hosts(rest)
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    login, at, hosts = netloc.rpartition("@")
    nodes = []
    for item in hosts.split(","):
        if not item:
            continue
        if item.startswith("["):  # [IPv6]:port
            host, _, tail = item[1:].partition("]")
            port = tail[1:] if tail.startswith(":") else ""
        else:
            host, _, port = item.partition(":")
        if not host:
            raise ValueError(f"empty host in {item!r}")
        try:
            number = int(port) if port else 0
        except ValueError:
            raise ValueError(f"bad port in {item!r}") from None
        nodes.append((host, number))
    if not nodes:
        raise ValueError("no host")
    return login + at, nodes, slash + path, dict(parse_qsl(query))


def _join_kombu_hosts(rest: str) -> str:
    """Kombu's host list (a broker URL we reuse) as ours: Kombu joins whole URLs with ``;``,
    each with its own login, path and query (``sentinel://:pw@h1:26379/0;sentinel://:pw@h2``).
    The hosts become one comma list; a login, path or query is taken from whichever URL has
    it, and two that differ are an error rather than a guess which one applies."""
    hosts: list[str] = []
    shared = {"login": "", "path": "", "query": ""}
    for number, piece in enumerate(rest.split(";")):
        if number:
            scheme, sep, tail = piece.partition("://")
            if sep and scheme.lower() not in SENTINEL_SCHEMES:
                raise ValueError(f"{scheme + '://'!r} after ';': only sentinels are listed so")
            piece = tail if sep else piece
        piece, question, query = piece.partition("?")
        netloc, slash, path = piece.partition("/")
        login, at, host = netloc.rpartition("@")
        hosts.append(host)
        for part, value in (("login", login + at), ("path", slash + path), ("query", query)):
            if value.strip("/") and shared[part].strip("/") and value != shared[part]:
                raise ValueError(f"the hosts separated by ';' have different {part}s")
            if value.strip("/"):
                shared[part] = value
    query = shared["query"]
    return shared["login"] + ",".join(hosts) + shared["path"] + ("?" + query if query else "")


def _options(tls: bool, login: str, path: str, query: dict[str, str]) -> dict[str, Any]:
    """Connection keywords from a login, path and query, as redis-py parses them."""
    single = f"{'rediss' if tls else 'redis'}://{login}localhost{path}"
    if query:
        single += "?" + urlencode(query)
    parse_url: Any = connection.parse_url  # untyped in redis-py
    options: dict[str, Any] = dict(parse_url(single))
    for key in ("host", "port", "connection_class"):
        options.pop(key, None)
    if tls:
        options["ssl"] = True
    return options


def _cluster_parts(url: str, tls: bool) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    login, nodes, path, query = _split(url)
    _check_db_path(path.strip("/"))
    options = _options(tls, login, path.rstrip("/") if path != "/" else "", query)
    if options.pop("db", 0) not in (0, None):
        raise ValueError("Redis Cluster has database 0 only")
    return nodes, options


def _sentinel_parts(url: str, tls: bool) -> tuple[list[tuple[str, int]], str, dict[str, Any]]:
    """(sentinels, master name, master connection options) of a Sentinel URL."""
    login, nodes, path, query = _split(url)
    parts = [part for part in path.split("/") if part]
    master = query.pop("master_name", None) or query.pop("service_name", None)
    if master is None and parts:
        master = parts.pop(0)
    if not master:
        raise ValueError(
            "no master name: sentinel://host:port/master-name[/db] (or, for a Celery "
            "broker, master_name in broker_transport_options)"
        )
    if len(parts) > 1:
        raise ValueError(f"path must be /master-name[/db], got {path!r}")
    _check_db_path(parts[0] if parts else "")
    return nodes, master, _options(tls, login, "/" + parts[0] if parts else "", query)


def _sentinel(url: str, tls: bool, redis_kwargs: dict[str, Any], sentinel_class: Any) -> Any:
    """The master client of a Sentinel URL: ``sentinel_class`` is redis-py's ``Sentinel``
    or its asyncio twin."""
    nodes, master, options = _sentinel_parts(url, tls)
    options.update(redis_kwargs)
    sentinel_kwargs = options.pop("sentinel_kwargs", None)
    if sentinel_kwargs is None:
        # Sentinels are reached like the master (TLS, timeouts) but without its login.
        sentinel_kwargs = {
            key: value
            for key, value in options.items()
            if key.startswith(("socket_", "ssl")) and key != "ssl_password"
        }
    sentinels = [(host, port or DEFAULT_SENTINEL_PORT) for host, port in nodes]
    manager = sentinel_class(sentinels, sentinel_kwargs=sentinel_kwargs, **options)
    return manager.master_for(master)


# -- what kind of client ---------------------------------------------------------------------


def is_cluster(redis_client: Any) -> bool:
    """True for a ``redis.cluster.RedisCluster``."""
    from redis.cluster import RedisCluster

    return isinstance(redis_client, RedisCluster)


def is_async_cluster(redis_client: Any) -> bool:
    """True for a ``redis.asyncio.cluster.RedisCluster``."""
    from redis.asyncio.cluster import RedisCluster

    return isinstance(redis_client, RedisCluster)


def pubsub_source(redis_client: Any) -> Any:
    """What the waiters' pub/sub connection is made from, and what the clients sharing its
    listener have in common: the client's connection pool, or on a Cluster the client."""
    return redis_client if is_cluster(redis_client) else redis_client.connection_pool


def pubsub_connection(source: Any, node_name: str | None = None) -> Any:
    """A new, unconnected connection for SUBSCRIBE from a :func:`pubsub_source`, with the
    client's settings (TLS, ACL user, ...) but no read timeout: a listener blocks in its read
    as long as it waits. On a Cluster, to the node named ``node_name`` ("host:port")."""
    if is_cluster(source):
        node = source.get_node(node_name=node_name)
        if node is None:  # no longer in the client's map: the listener looks again
            raise redis.ConnectionError(f"no cluster node {node_name}")
        pool = source.get_redis_connection(node).connection_pool
        return pubsub_connection_of(pool)
    return pubsub_connection_of(source)


def pubsub_connection_of(pool: Any) -> Any:
    """:func:`pubsub_connection` from ``pool`` (redis-py's or its asyncio twin)."""
    kwargs = dict(pool.connection_kwargs)
    kwargs["socket_timeout"] = None
    # RESP2 keeps pub/sub replies plain arrays. redis-py 8 defaults to RESP3 and would then
    # insist on maintenance notifications, which RESP2 without hiredis cannot carry.
    kwargs["protocol"] = 2
    if "maint_notifications_config" in kwargs:
        kwargs["maint_notifications_config"] = None
    return pool.connection_class(**kwargs)


# -- naming a client without its password ----------------------------------------------------


def _tls(pool: Any) -> bool:
    return "ssl" in str(getattr(pool, "connection_class", "")).lower()


def safe_url(redis_client: Any) -> str:
    """A URL naming the server(s) of ``redis_client``, with no password in it."""
    if is_cluster(redis_client) or is_async_cluster(redis_client):
        nodes = list(redis_client.nodes_manager.startup_nodes.values())
        first = nodes[0] if nodes else None
        if is_cluster(redis_client):  # a sync node has its settings in its client's pool
            first = getattr(getattr(first, "redis_connection", None), "connection_pool", None)
        kwargs = getattr(first, "connection_kwargs", {}) or {}
        login = f"{kwargs['username']}@" if kwargs.get("username") else ""
        hosts = ",".join(sorted(f"{node.host}:{node.port}" for node in nodes))
        return f"{'rediss' if _tls(first) else 'redis'}+cluster://{login}{hosts}"
    pool: Any = getattr(redis_client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", {}) or {}
    db = kwargs.get("db", 0)
    user = f"{kwargs['username']}@" if kwargs.get("username") else ""
    manager = getattr(pool, "sentinel_manager", None)
    if manager is not None:
        hosts = ",".join(
            "{host}:{port}".format(**sentinel.connection_pool.connection_kwargs)
            for sentinel in manager.sentinels
        )
        scheme = "rediss+sentinel" if _tls(pool) else "sentinel"
        return f"{scheme}://{user}{hosts}/{pool.service_name}/{db}"
    if "path" in kwargs:
        return f"unix://{user}{kwargs['path']}?db={db}"
    scheme = "rediss" if _tls(pool) else "redis"
    return f"{scheme}://{user}{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"
