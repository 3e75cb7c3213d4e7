#include "slurm_plugin/plugin_args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(char* err, size_t err_len, const char* arg, const char* why) {
  snprintf(err, err_len, "plugstack argument \"%s\": %s", arg, why);
  return -1;
}

/* Copies `value` into `dst` (DUET_ARG_MAX bytes); 0, or -1 when too long. */
static int copy_value(char* dst, const char* value) {
  size_t n = strlen(value);
  if (n >= DUET_ARG_MAX) return -1;
  memcpy(dst, value, n + 1);
  return 0;
}

/* The index of `value` among the NULL-terminated `names`, or -1. */
static int index_of(const char* value, const char* const* names) {
  for (int i = 0; names[i]; ++i) {
    if (strcmp(value, names[i]) == 0) return i;
  }
  return -1;
}

/* Copies the absolute path `value` of `arg` into `dst` (DUET_ARG_MAX bytes);
 * 0, or -1 with `err` set. */
static int copy_path(char* dst, const char* arg, const char* value, char* err, size_t err_len) {
  if (value[0] != '/') return bad(err, err_len, arg, "must be an absolute path");
  if (copy_value(dst, value)) return bad(err, err_len, arg, "too long");
  return 0;
}

int duet_spank_parse_args(int argc, const char* const* argv, struct duet_spank_args* c,
                          char* err, size_t err_len) {
  memset(c, 0, sizeof(*c));
  strcpy(c->bridge, "unix:///run/duet/bridge.sock");
  c->timeout_ms = 2000;
  c->on_unreachable = DUET_UNREACHABLE_FAIL;
  c->tpu = DUET_TPU_AUTO;
  c->auth = DUET_AUTH_MUNGE;
  int auth_given = 0; /* auth= or munge= seen */
  for (int i = 0; i < argc; ++i) {
    const char* arg = argv[i] ? argv[i] : "";
    const char* eq = strchr(arg, '=');
    const size_t key_len = eq ? (size_t)(eq - arg) : strlen(arg);
    const char* value = eq ? eq + 1 : "";
#define KEY_IS(k) (key_len == strlen(k) && strncmp(arg, k, key_len) == 0)
    if (KEY_IS("bridge")) {
      if (!*value) return bad(err, err_len, arg, "address is empty");
      if (copy_value(c->bridge, value)) return bad(err, err_len, arg, "too long");
    } else if (KEY_IS("agent")) {
      /* The path must fit a unix socket address (108 bytes with its NUL). */
      if (strncmp(value, "unix:///", 8) != 0) {
        return bad(err, err_len, arg, "must be unix:///absolute/path");
      }
      if (strlen(value) - 7 > 107) return bad(err, err_len, arg, "socket path over 107 bytes");
      if (copy_value(c->agent, value)) return bad(err, err_len, arg, "too long");
    } else if (KEY_IS("timeout_ms")) {
      char* end = NULL;
      errno = 0;
      long v = strtol(value, &end, 10);
      if (!*value || *end || errno || v < 1 || v > 60000) {
        return bad(err, err_len, arg, "must be an integer in 1..60000");
      }
      c->timeout_ms = (int)v;
    } else if (KEY_IS("on_unreachable")) {
      /* Indexed by enum duet_on_unreachable. */
      static const char* const names[] = {"fail", "allow", NULL};
      const int v = index_of(value, names);
      if (v < 0) return bad(err, err_len, arg, "must be fail or allow");
      c->on_unreachable = v;
    } else if (KEY_IS("tpu")) {
      /* Indexed by enum duet_tpu_probe. */
      static const char* const names[] = {"auto", "yes", "no", NULL};
      const int v = index_of(value, names);
      if (v < 0) return bad(err, err_len, arg, "must be auto, yes or no");
      c->tpu = v;
    } else if (KEY_IS("client")) {
      if (copy_path(c->client, arg, value, err, err_len)) return -1;
    } else if (KEY_IS("auth") || KEY_IS("munge")) {
      /* munge=yes|no is the older spelling of auth=munge|none. */
      int a;
      if (strcmp(value, KEY_IS("auth") ? "munge" : "yes") == 0) {
        a = DUET_AUTH_MUNGE;
      } else if (KEY_IS("auth") && strcmp(value, "slurm_key") == 0) {
        a = DUET_AUTH_SLURM_KEY;
      } else if (strcmp(value, KEY_IS("auth") ? "none" : "no") == 0) {
        a = DUET_AUTH_NONE;
      } else {
        return bad(err, err_len, arg,
                   KEY_IS("auth") ? "must be munge, slurm_key or none" : "must be yes or no");
      }
      if (auth_given && a != c->auth) {
        return bad(err, err_len, arg, "contradicts an auth= or munge= argument before it");
      }
      c->auth = a;
      auth_given = 1;
    } else if (KEY_IS("munge_socket")) {
      if (copy_path(c->munge_socket, arg, value, err, err_len)) return -1;
    } else if (KEY_IS("slurm_key")) {
      if (copy_path(c->slurm_key, arg, value, err, err_len)) return -1;
    } else if (eq == NULL && strcmp(arg, "disabled") == 0) {
      c->disabled = 1;
    } else {
      return bad(err, err_len, arg,
                 "unknown key (known: bridge, agent, timeout_ms, on_unreachable, tpu, client, auth, "
                 "munge, munge_socket, slurm_key, disabled)");
    }
#undef KEY_IS
  }
  return 0;
}
