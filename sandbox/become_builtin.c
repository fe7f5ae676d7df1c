/* handhold_become [UID GID NAME]: a bash loadable builtin that makes a subshell a shell of its own, as the user.

   The session's loop forks a subshell per command instead of running `setpriv` and a fresh bash (two execs:
   about 4 of a command's 6 ms). This gives the subshell what a fresh bash would have: its own $$, its parent as
   $PPID, a subshell level of 0 and no $!. Given a user, it then drops to it like `setpriv --reuid --regid
   --init-groups`: the user's groups, its gid, its uid, real, effective and saved alike; bash's own idea of who
   runs it (the readonly UID and EUID, and the ids its `test` and PATH search compare files against) follows, and
   the process is made dumpable again (a change of ids clears it, and /dev/fd/N, which the command's shell reads
   its state through, would then be root's).

   No bash headers are needed: the few declarations below have kept this layout since bash 4. Built by
   sandbox/become_builtin.py; the loop checks it in a subshell before it relies on it. */
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct word_desc { char *word; int flags; } WORD_DESC;
typedef struct word_list { struct word_list *next; WORD_DESC *word; } WORD_LIST;
typedef struct variable {
  char *name, *value, *exportstr;
  void *dynamic_value, *assign_func;
  int attributes, context;
} SHELL_VAR;
struct user_info { uid_t uid, euid; gid_t gid, egid; char *user_name, *shell, *home_dir; };
struct builtin {
  char *name;
  int (*function)(WORD_LIST *);
  int flags;
  char *const *long_doc;
  const char *short_doc;
  char *handle;
};

#define BUILTIN_ENABLED 0x01
#define ATT_READONLY 0x02
#define NO_PID ((pid_t)-1)

extern struct user_info current_user;
extern pid_t dollar_dollar_pid, last_asynchronous_pid;
extern int subshell_level;
extern SHELL_VAR *find_variable(const char *);
extern SHELL_VAR *bind_variable(const char *, char *, int);
extern void set_ppid(void);

static void set_readonly(const char *name, unsigned long value) {
  char text[24];
  SHELL_VAR *v = find_variable(name);
  snprintf(text, sizeof text, "%lu", value);
  if (v) v->attributes &= ~ATT_READONLY;
  v = bind_variable(name, text, 0);
  if (v) v->attributes |= ATT_READONLY;
}

static int drop(const char *uid_text, const char *gid_text, const char *name) {
  uid_t uid = (uid_t)strtoul(uid_text, NULL, 10);
  gid_t gid = (gid_t)strtoul(gid_text, NULL, 10);
  if (initgroups(name, gid) || setgid(gid) || setuid(uid) || prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)) {
    perror("handhold_become");
    return 1;
  }
  current_user.uid = current_user.euid = uid;
  current_user.gid = current_user.egid = gid;
  set_readonly("UID", uid);
  set_readonly("EUID", uid);
  return 0;
}

static int become_builtin(WORD_LIST *list) {
  char *arg[3];
  int n = 0;
  for (; list && n < 3; list = list->next) arg[n++] = list->word->word;
  if (list || (n != 0 && n != 3)) {
    fprintf(stderr, "handhold_become: usage: handhold_become [uid gid name]\n");
    return 2;
  }
  dollar_dollar_pid = getpid();
  last_asynchronous_pid = NO_PID;
  subshell_level = 0;
  set_ppid();
  return n == 3 ? drop(arg[0], arg[1], arg[2]) : 0;
}

static char *const become_doc[] = {"Make this subshell a shell of its own, as the user given: UID GID NAME.", NULL};

struct builtin handhold_become_struct = {
    "handhold_become", become_builtin, BUILTIN_ENABLED, become_doc, "handhold_become [uid gid name]", NULL};
