"""Checks deploy/kubernetes/ (run by check_deploy.sh).

Each manifest must parse and hold exactly the kinds expected of it, and the
objects must agree with each other: selectors with pod labels, volumes with
the PVC and the Secret, the ports in the container args with the container
ports and the Services, the worker's --master with the master's Service, every
$(VAR) in args with the container's env. Prints one "VERB FLAG" line per flag
in a container's args, as "WHERE VERB FLAG" (the image's entrypoint is
`tessera`, so args[0] is the verb), for check_deploy.sh to hold against
`tessera VERB --help`.

Usage: check_manifests.py DEPLOY_KUBERNETES_DIR. Exit 1 with one line per
problem on stderr.
"""

import os
import re
import sys

import yaml

EXPECTED_KINDS = {
    "namespace.yaml": ["Namespace"],
    "master.yaml": ["PersistentVolumeClaim", "PersistentVolumeClaim", "Deployment", "Service"],
    "worker.yaml": ["Service", "StatefulSet"],
    "secret.example.yaml": ["Secret"],
    "kustomization.yaml": ["Kustomization"],
}

problems = []
# verb -> (workingDir, its volume's claim): the outputs every pod shares.
working_dirs = {}


def problem(message):
    problems.append(message)


def load(directory):
    docs = {}
    found = sorted(f for f in os.listdir(directory) if f.endswith((".yaml", ".yml")))
    if found != sorted(EXPECTED_KINDS):
        problem(f"manifests {found}, expected {sorted(EXPECTED_KINDS)}")
    for name in found:
        with open(os.path.join(directory, name)) as f:
            try:
                docs[name] = [d for d in yaml.safe_load_all(f) if d is not None]
            except yaml.YAMLError as e:
                problem(f"{name}: does not parse: {e}")
                continue
        kinds = [d.get("kind") for d in docs[name]]
        if kinds != EXPECTED_KINDS.get(name, kinds):
            problem(f"{name}: kinds {kinds}, expected {EXPECTED_KINDS[name]}")
    return docs


def flag_value(args, flag):
    """The value of --flag=V or --flag V in args, else None."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1:]
    return None


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def check_workload(name, workload, objects, flags_out):
    spec = workload["spec"]
    template = spec["template"]
    labels = template["metadata"]["labels"]
    selector = spec["selector"]["matchLabels"]
    if any(labels.get(k) != v for k, v in selector.items()):
        problem(f"{name}: selector {selector} does not match the pod labels {labels}")
    pod = template["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for container in pod["containers"]:
        where = f"{name}/{container['name']}"
        args = [str(a) for a in container.get("args", [])]
        if not args:
            problem(f"{where}: no args (the first is the tessera verb)")
            continue
        verb = args[0]
        for arg in args[1:]:
            if arg.startswith("--"):
                flags_out.append(f"{where} {verb} {arg.split('=', 1)[0]}")
        env = {e["name"] for e in container.get("env", [])}
        for arg in args:
            for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg):
                if var not in env:
                    problem(f"{where}: args use $({var}), which its env does not define")
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        listen = flag_value(args, "--listen")
        if listen is None or port_of(listen) != ports.get("grpc"):
            problem(f"{where}: --listen {listen} is not on containerPort grpc {ports.get('grpc')}")
        if verb == "master" and (listen is None or not listen.startswith("0.0.0.0:")):
            problem(f"{where}: the master must listen on 0.0.0.0 in a pod, not {listen} (its default is 127.0.0.1)")
        metrics = flag_value(args, "--metrics-port")
        if metrics is not None and int(metrics) != ports.get("metrics"):
            problem(f"{where}: --metrics-port {metrics} is not containerPort metrics {ports.get('metrics')}")
        mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
        for mount in mounts.values():
            if mount["name"] not in volumes:
                problem(f"{where}: mounts volume {mount['name']}, which the pod does not have")
        for flag in ("--token-file", "--state-dir"):
            path = flag_value(args, flag)
            if path is None:
                if flag == "--token-file":
                    problem(f"{where}: no --token-file")
                continue
            under = [p for p in mounts if path.startswith(p.rstrip("/") + "/")]
            if not under:
                problem(f"{where}: {flag} {path} is on no volume")
                continue
            volume = volumes.get(mounts[max(under, key=len)]["name"], {})
            rest = path[len(max(under, key=len).rstrip("/")) + 1:]
            if flag == "--token-file":
                secret = volume.get("secret", {})
                if secret.get("secretName") not in objects.get("Secret", {}):
                    problem(f"{where}: the token's volume is not the Secret {sorted(objects.get('Secret', {}))}")
                items = {i["path"]: i["key"] for i in secret.get("items", [])}
                secret_keys = objects.get("Secret", {}).get(secret.get("secretName"), {}).get("stringData", {})
                if items.get(rest) not in secret_keys:
                    problem(f"{where}: --token-file {path} is not a key of the Secret")
            else:
                claim = volume.get("persistentVolumeClaim", {}).get("claimName")
                if claim not in objects.get("PersistentVolumeClaim", {}):
                    problem(f"{where}: --state-dir {path} is not on the PersistentVolumeClaim")
        # train.output_dir: the master resolves it under its workingDir and
        # every worker writes its checkpoint shards there, so the directory
        # is on one ReadWriteMany claim, mounted at the same path in both.
        workdir = container.get("workingDir", "")
        under = [p for p in mounts if workdir == p.rstrip("/") or workdir.startswith(p.rstrip("/") + "/")]
        claim = None
        if under:
            claim = volumes.get(mounts[max(under, key=len)]["name"], {}).get("persistentVolumeClaim", {}).get("claimName")
        if claim is None:
            problem(f"{where}: workingDir {workdir!r} (where train.output_dir lands) is on no PersistentVolumeClaim")
        else:
            modes = objects.get("PersistentVolumeClaim", {}).get(claim, {}).get("spec", {}).get("accessModes", [])
            if "ReadWriteMany" not in modes:
                problem(f"{where}: the outputs claim {claim} is {modes}, not ReadWriteMany (master and workers write it)")
        working_dirs[verb] = (workdir, claim)
        if verb == "worker":
            master = flag_value(args, "--master") or ""
            host, _, port = master.rpartition(":")
            service = objects.get("Service", {}).get(host)
            if service is None or int(port) not in [p["port"] for p in service["spec"]["ports"]]:
                problem(f"{where}: --master {master} is not a port of a Service")
            for flag in ("--listen", "--data-address", "--id"):
                value = flag_value(args, flag) or ""
                if "$(" not in value:
                    problem(f"{where}: {flag} {value} is not the pod's own (downward API)")
    return labels, pod


def main():
    directory = sys.argv[1]
    docs = load(directory)
    objects = {}
    for name, items in docs.items():
        for obj in items:
            objects.setdefault(obj["kind"], {})[obj.get("metadata", {}).get("name")] = obj
    kustomization = objects.get("Kustomization", {}).get(None, {})
    for resource in kustomization.get("resources", []):
        if resource not in docs:
            problem(f"kustomization.yaml: resource {resource} does not exist")
    if "secret.example.yaml" in kustomization.get("resources", []):
        problem("kustomization.yaml: must not apply the Secret template (its token is a placeholder)")
    flags = []
    pods = []
    for file, items in docs.items():
        for obj in items:
            if obj["kind"] in ("Deployment", "StatefulSet"):
                where = f"deploy/kubernetes/{file}:{obj['kind']}/{obj['metadata']['name']}"
                pods.append(check_workload(where, obj, objects, flags))
    for name, service in objects.get("Service", {}).items():
        selector = service["spec"]["selector"]
        matched = [pod for labels, pod in pods if all(labels.get(k) == v for k, v in selector.items())]
        if len(matched) != 1:
            problem(f"Service {name}: selects {len(matched)} workloads, expected 1")
            continue
        names = {p["name"] for c in matched[0]["containers"] for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            if port["targetPort"] not in names:
                problem(f"Service {name}: targetPort {port['targetPort']} is no container port of its pods")
    if working_dirs.get("master") != working_dirs.get("worker"):
        problem(f"the master's and the workers' outputs differ: {working_dirs} (checkpoints would land elsewhere)")
    for sts in objects.get("StatefulSet", {}).values():
        if sts["spec"].get("serviceName") not in objects.get("Service", {}):
            problem(f"StatefulSet: serviceName {sts['spec'].get('serviceName')} is not a Service")
    if problems:
        for p in problems:
            print(f"check_manifests: {p}", file=sys.stderr)
        return 1
    print("\n".join(flags))
    return 0


if __name__ == "__main__":
    sys.exit(main())
