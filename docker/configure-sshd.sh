#!/usr/bin/env bash
# sshd for multi-host MPI: port 22, host keys present, root login by key only, no passwords,
# pam_loginuid optional (it fails in containers), and no host-key prompts between the job's
# hosts. Every host runs the same image, so one root key pair, generated here at build time
# (never in the repository), lets the hosts reach each other, as in AWS's DLC images. There is no
# authorized_keys file: sshd asks dtc-authorized-keys (dtc_entrypoint.ssh_access) at each login,
# which accepts the key only from the job's own hosts (resourceconfig.json), resolved then.
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
mkdir -p /run/sshd /root/.ssh /etc/ssh/sshd_config.d /etc/ssh/ssh_config.d
chmod 700 /root/.ssh
ssh-keygen -A
[ -f /root/.ssh/id_ed25519 ] || ssh-keygen -q -t ed25519 -N '' -f /root/.ssh/id_ed25519
install -m 0644 /root/.ssh/id_ed25519.pub /etc/ssh/dtc_job_key.pub
rm -f /root/.ssh/authorized_keys
cat > /etc/ssh/sshd_config.d/dtc.conf <<CONF
Port 22
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
AuthorizedKeysFile none
AuthorizedKeysCommand ${VENV:?}/bin/dtc-authorized-keys %u
AuthorizedKeysCommandUser root
CONF
cat > /etc/ssh/ssh_config.d/dtc.conf <<'CONF'
Host *
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
CONF
cp /etc/ssh/ssh_config.d/dtc.conf /root/.ssh/config
sed -i 's/^session\s\+required\s\+pam_loginuid.so/session optional pam_loginuid.so/' /etc/pam.d/sshd
/usr/sbin/sshd -t
log "sshd configured"
